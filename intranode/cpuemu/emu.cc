#include "shim.h"
#include "kernels_gen.h"

thread_local EmuCtx emu;

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

extern "C" int emu_launch(const char* name, int grid, int block, int smem, const unsigned char* params) {
  Reader r{params};
  std::function<void()> body;
  std::string n(name);
  if (n == "goep_intranode_notify") {
    auto a0 = r.get<const u64*>(); auto a1 = r.get<u64>(); auto a2 = r.get<u64>(); auto a3 = r.get<u64>();
    auto a4 = r.get<const i64*>(); auto a5 = r.get<int>(); auto a6 = r.get<int>(); auto a7 = r.get<int>();
    auto a8 = r.get<int>(); auto a9 = r.get<int>(); auto a10 = r.get<int>(); auto a11 = r.get<i32*>();
    auto a12 = r.get<i32*>(); auto a13 = r.get<i32*>(); auto a14 = r.get<i32*>(); auto a15 = r.get<i32*>();
    auto a16 = r.get<i32*>(); auto a17 = r.get<i32*>(); auto a18 = r.get<goep_watchdog*>(); auto a19 = r.get<u32>();
    body = [=] { goep_intranode_notify(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19); };
  } else if (n == "goep_intranode_dispatch" || n == "goep_intranode_dispatch_wide") {
    auto a0 = r.get<const u64*>(); auto a1 = r.get<u64>(); auto a2 = r.get<u64>(); auto a3 = r.get<u64>();
    auto a4 = r.get<u64>(); auto a5 = r.get<u64>(); auto a6 = r.get<u64>(); auto a7 = r.get<const u8*>();
    auto a8 = r.get<const float*>(); auto a9 = r.get<const i64*>(); auto a10 = r.get<const float*>();
    auto a11 = r.get<const i32*>(); auto a12 = r.get<const i32*>(); auto a13 = r.get<int>(); auto a14 = r.get<int>();
    auto a15 = r.get<int>(); auto a16 = r.get<int>(); auto a17 = r.get<int>(); auto a18 = r.get<int>();
    auto a19 = r.get<int>(); auto a20 = r.get<int>(); auto a21 = r.get<int>(); auto a22 = r.get<goep_watchdog*>();
    auto a23 = r.get<u32>();
    if (n == "goep_intranode_dispatch") {
      body = [=] { goep_intranode_dispatch(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23); };
    } else {
      body = [=] { goep_intranode_dispatch_wide(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22, a23); };
    }
  } else if (n == "goep_intranode_combine") {
    auto a0 = r.get<const u64*>(); auto a1 = r.get<u64>(); auto a2 = r.get<u64>(); auto a3 = r.get<u64>();
    auto a4 = r.get<const i32*>(); auto a5 = r.get<const i32*>(); auto a6 = r.get<const u8*>(); auto a7 = r.get<const u8*>();
    auto a8 = r.get<u8*>(); auto a9 = r.get<float*>(); auto a10 = r.get<int>(); auto a11 = r.get<int>();
    auto a12 = r.get<int>(); auto a13 = r.get<int>(); auto a14 = r.get<int>(); auto a15 = r.get<int>();
    auto a16 = r.get<goep_watchdog*>(); auto a17 = r.get<u32>();
    body = [=] { goep_intranode_combine(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17); };
  } else if (n == "goep_intranode_copy_rows") {
    auto a0 = r.get<const u8*>(); auto a1 = r.get<u8*>(); auto a2 = r.get<const i32*>(); auto a3 = r.get<int>();
    auto a4 = r.get<u64>();
    body = [=] { goep_intranode_copy_rows(a0, a1, a2, a3, a4); };
  } else {
    return -1;
  }
  std::vector<std::unique_ptr<EmuBlock>> blocks;
  for (int b = 0; b < grid; ++b) blocks.emplace_back(new EmuBlock(block));
  std::vector<std::thread> ts;
  for (int b = 0; b < grid; ++b) {
    for (int t = 0; t < block; ++t) {
      ts.emplace_back([&, b, t] {
        emu.tid = {(unsigned)t, 0, 0};
        emu.bid = {(unsigned)b, 0, 0};
        emu.bdim = {(unsigned)block, 1, 1};
        emu.gdim = {(unsigned)grid, 1, 1};
        emu.block = blocks[b].get();
        emu.shm_off = 0;
        emu.dyn_off = 32 << 10;
        body();
      });
    }
  }
  for (auto& t : ts) t.join();
  (void)smem;
  return 0;
}
