#include "shim.h"
#include "kernels_gen.h"

#include <functional>
#include <string>

thread_local EmuCtx emu;

// Kernel parameters, read back from the packed buffer (natural alignment,
// as internal/device.Args packs them).
struct Reader {
  const unsigned char* p;
  size_t off = 0;
  template <class T>
  T get() {
    off = (off + sizeof(T) - 1) / sizeof(T) * sizeof(T);
    T v;
    memcpy(&v, p + off, sizeof(T));
    off += sizeof(T);
    return v;
  }
};

typedef const goep_coll_ctx* Ctx;

extern "C" int emu_launch(const char* name, int grid, int block, const unsigned char* params) {
  Reader r{params};
  std::function<void()> body;
  std::string n(name);
  if (n == "goep_coll_ar_ll1" || n == "goep_coll_ar_ll2" || n == "goep_coll_rs_ll") {
    auto c = r.get<Ctx>(); auto in = r.get<const void*>(); auto out = r.get<void*>(); auto count = r.get<u64>();
    auto dt = r.get<u32>(); auto op = r.get<u32>();
    auto fn = n == "goep_coll_ar_ll1" ? goep_coll_ar_ll1 : (n == "goep_coll_ar_ll2" ? goep_coll_ar_ll2 : goep_coll_rs_ll);
    body = [=] { fn(c, in, out, count, dt, op); };
  } else if (n == "goep_coll_ag_ll") {
    auto c = r.get<Ctx>(); auto in = r.get<const void*>(); auto out = r.get<void*>(); auto bytes = r.get<u64>();
    body = [=] { goep_coll_ag_ll(c, in, out, bytes); };
  } else if (n == "goep_coll_ar_rsag" || n == "goep_coll_rs_scratch") {
    auto c = r.get<Ctx>(); auto in = r.get<const void*>(); auto out = r.get<void*>(); auto count = r.get<u64>();
    auto dt = r.get<u32>(); auto op = r.get<u32>(); auto cell = r.get<u64>();
    auto fn = n == "goep_coll_ar_rsag" ? goep_coll_ar_rsag : goep_coll_rs_scratch;
    body = [=] { fn(c, in, out, count, dt, op, cell); };
  } else if (n == "goep_coll_ag_scratch") {
    auto c = r.get<Ctx>(); auto in = r.get<const void*>(); auto out = r.get<void*>(); auto bytes = r.get<u64>();
    auto cell = r.get<u64>();
    body = [=] { goep_coll_ag_scratch(c, in, out, bytes, cell); };
  } else if (n == "goep_coll_ar_zc") {
    auto c = r.get<Ctx>(); auto in = r.get<const void*>(); auto out = r.get<void*>(); auto count = r.get<u64>();
    auto dt = r.get<u32>(); auto op = r.get<u32>(); auto ir = r.get<u32>(); auto io = r.get<u64>();
    auto orr = r.get<u32>(); auto oo = r.get<u64>();
    body = [=] { goep_coll_ar_zc(c, in, out, count, dt, op, ir, io, orr, oo); };
  } else if (n == "goep_coll_ag_zc") {
    auto c = r.get<Ctx>(); auto in = r.get<const void*>(); auto out = r.get<void*>(); auto bytes = r.get<u64>();
    auto orr = r.get<u32>(); auto oo = r.get<u64>();
    body = [=] { goep_coll_ag_zc(c, in, out, bytes, orr, oo); };
  } else if (n == "goep_coll_rs_zc") {
    auto c = r.get<Ctx>(); auto in = r.get<const void*>(); auto out = r.get<void*>(); auto count = r.get<u64>();
    auto dt = r.get<u32>(); auto op = r.get<u32>(); auto ir = r.get<u32>(); auto io = r.get<u64>();
    body = [=] { goep_coll_rs_zc(c, in, out, count, dt, op, ir, io); };
  } else if (n == "goep_coll_fill") {
    auto buf = r.get<void*>(); auto count = r.get<u64>(); auto dt = r.get<u32>(); auto fill = r.get<u32>();
    auto seed = r.get<u32>(); auto rank = r.get<u32>(); auto first = r.get<u64>();
    body = [=] { goep_coll_fill(buf, count, dt, fill, seed, rank, first); };
  } else if (n == "goep_coll_check") {
    auto buf = r.get<const void*>(); auto count = r.get<u64>(); auto dt = r.get<u32>(); auto op = r.get<u32>();
    auto fill = r.get<u32>(); auto seed = r.get<u32>(); auto kind = r.get<u32>(); auto world = r.get<u32>();
    auto rank = r.get<u32>(); auto nn = r.get<u64>(); auto out = r.get<u64*>();
    body = [=] { goep_coll_check(buf, count, dt, op, fill, seed, kind, world, rank, nn, out); };
  } else {
    return -1;
  }
  std::vector<std::unique_ptr<EmuBlock>> blocks;
  for (int b = 0; b < grid; ++b) blocks.emplace_back(new EmuBlock(block));
  std::vector<std::thread> ts;
  ts.reserve((size_t)grid * block);
  for (int b = 0; b < grid; ++b) {
    for (int t = 0; t < block; ++t) {
      ts.emplace_back([&, b, t] {
        emu.tid = {(unsigned)t, 0, 0};
        emu.bid = {(unsigned)b, 0, 0};
        emu.bdim = {(unsigned)block, 1, 1};
        emu.gdim = {(unsigned)grid, 1, 1};
        emu.block = blocks[b].get();
        emu.shm_off = 0;
        body();
      });
    }
  }
  for (auto& t : ts) t.join();
  return 0;
}
