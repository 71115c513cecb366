// Runs kernels/layout.cu (rewritten by emulate_test.go into layout_emu.cu)
// on the host. Protocol on stdin, little-endian, repeated until EOF:
//   i32 T, K, E, R, threads, blocks, is_int32, row_offset; then T*K ids
//   (4 or 8 bytes each).
// For each case it writes to stdout: i32 per_rank[R], i32 per_expert[E],
// i32 invalid, u8 is_token_in_rank[T*R], u8 guard_ok, u8 workspace_clean.
// Outputs are poisoned before the launch; the case runs twice on one
// workspace and the second run's results are written.
#include "layout_emu.cu"

#include <cstdio>
#include <cstring>

thread_local emu_dim3 threadIdx;
emu_dim3 blockIdx, blockDim, gridDim;
emu_block* emu_cur;

template <typename F>
static void launch(int blocks, int threads, int smem_ints, F body) {
  gridDim = {(unsigned)blocks, 1, 1};
  blockDim = {(unsigned)threads, 1, 1};
  for (int b = 0; b < blocks; ++b) {
    blockIdx = {(unsigned)b, 0, 0};
    emu_block blk;
    blk.bar.reset(new std::barrier<>(threads));
    for (int w = 0; w < threads / 32; ++w) blk.warp_bar.emplace_back(new std::barrier<>(32));
    blk.votes.assign(threads, 0);
    blk.dyn_smem.assign(smem_ints, 0x7f7f7f7f);  // garbage: the kernel must clear it
    emu_cur = &blk;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&body, t] {
        threadIdx = {(unsigned)t, 0, 0};
        body();
      });
    }
    for (auto& th : ts) th.join();
  }
}

static bool read_all(void* p, size_t n) { return fread(p, 1, n, stdin) == n; }

template <typename Idx>
static void run(int T, int K, int E, int R, int threads, int blocks, int row_off) {
  std::vector<Idx> topk((size_t)T * K);
  if (!read_all(topk.data(), topk.size() * sizeof(Idx))) std::exit(2);
  std::vector<i32> pr(R), pe(E), inv(1);
  std::vector<u8> rows((size_t)T * R + 16);
  std::vector<u32> ws(1 + 4096 + 64 + 1, 0);
  for (int rep = 0; rep < 2; ++rep) {
    std::fill(pr.begin(), pr.end(), 0x5a5a5a5a);
    std::fill(pe.begin(), pe.end(), 0x5a5a5a5a);
    inv[0] = 0x5a5a5a5a;
    std::fill(rows.begin(), rows.end(), 0xa5);
    launch(blocks, threads, E + R + 1, [&] {
      goep_layout<Idx>(topk.data(), T, K, E, R, pr.data(), pe.data(), rows.data() + row_off, inv.data(), ws.data());
    });
  }
  u8 guard = 1, clean = 1;
  for (size_t i = 0; i < rows.size(); ++i) {
    if ((i < (size_t)row_off || i >= (size_t)row_off + (size_t)T * R) && rows[i] != 0xa5) guard = 0;
  }
  for (u32 w : ws) clean &= (w == 0);
  fwrite(pr.data(), 4, pr.size(), stdout);
  fwrite(pe.data(), 4, pe.size(), stdout);
  fwrite(inv.data(), 4, 1, stdout);
  fwrite(rows.data() + row_off, 1, (size_t)T * R, stdout);
  fwrite(&guard, 1, 1, stdout);
  fwrite(&clean, 1, 1, stdout);
}

int main() {
  i32 h[8];
  while (read_all(h, sizeof h)) {
    if (h[6]) {
      run<i32>(h[0], h[1], h[2], h[3], h[4], h[5], h[7]);
    } else {
      run<i64>(h[0], h[1], h[2], h[3], h[4], h[5], h[7]);
    }
  }
  return 0;
}
