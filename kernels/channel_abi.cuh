// channel_abi.cuh: the device-side structs of goep's channels (semaphores,
// memory channels, LL packets, the watchdog that bounds every spin).
//
// The host builds these structs byte by byte in Go (channels/devapi/layout.go)
// and uploads arrays of them to device memory; kernels receive a pointer to
// such an array, never the structs by value. Every size and offset below is
// pinned twice: by the static_asserts here and by a Go test that compares
// this file's asserts with the Go layout and compiles the Go layout's own
// asserts with NVRTC. Change a struct here, in layout.go and in the twins
// together.
//
// All pointers are generic addresses of global memory: local device memory,
// a peer GPU's memory mapped through CUDA IPC or peer access, or host memory
// mapped into the device (the timeout record).
#ifndef GOEP_CHANNEL_ABI_CUH
#define GOEP_CHANNEL_ABI_CUH

#include "common.cuh"

// offsetof without <cstddef>: NVRTC 11.8 has neither offsetof nor
// __builtin_offsetof, but its EDG front end folds __INTADDR__ to a constant.
#if defined(__has_builtin)
#if __has_builtin(__builtin_offsetof)
#define GOEP_OFFSETOF(T, f) __builtin_offsetof(T, f)
#endif
#endif
#ifndef GOEP_OFFSETOF
#define GOEP_OFFSETOF(T, f) ((u64)__INTADDR__(&(((T*)0)->f)))
#endif

// ---------------------------------------------------------------------------
// Timeout record: pinned host memory mapped into the device. The first
// thread whose bounded spin expires fills it and writes state last (with
// release at system scope), so a host that reads state != 0 sees the other
// fields complete.

enum {
  GOEP_TIMEOUT_NONE = 0,
  GOEP_TIMEOUT_EXPIRED = 1,  // a spin ran past the watchdog's timeout
};

// What the expired spin was waiting for (goep_timeout_record.op).
enum {
  GOEP_OP_SEM_WAIT = 1,          // goep_sem_wait: inbound token >= expected
  GOEP_OP_SEM_RELAXED_WAIT = 2,  // goep_sem_relaxed_wait
  GOEP_OP_SEM_POLL = 3,          // a loop of goep_sem_poll bounded by goep_spin
  GOEP_OP_PACKET = 4,            // an LL packet whose flags never matched
  GOEP_OP_VALUE = 5,             // goep_wait_ge_*: a counter never reached its target
  GOEP_OP_FIFO_PUSH = 6,         // a FIFO push found the ring full and the proxy never made room
  GOEP_OP_FLUSH = 7,             // a port channel flush the proxy never completed
};

struct goep_timeout_record {
  u32 state;      // GOEP_TIMEOUT_*; written last
  u32 op;         // GOEP_OP_*
  u32 id;         // channel / semaphore / wait id (the host names it)
  u32 peer;       // peer rank the spin waited on
  u32 stage;      // caller-defined stage of the kernel
  u32 reserved;
  u64 waited_ns;  // how long the spin had waited when it gave up
  u64 expected;   // what it waited for (token, flag or counter value)
  u64 observed;   // the last value it saw
};
static_assert(sizeof(goep_timeout_record) == 48, "goep: goep_timeout_record layout");
static_assert(GOEP_OFFSETOF(goep_timeout_record, state) == 0, "goep: goep_timeout_record.state");
static_assert(GOEP_OFFSETOF(goep_timeout_record, op) == 4, "goep: goep_timeout_record.op");
static_assert(GOEP_OFFSETOF(goep_timeout_record, id) == 8, "goep: goep_timeout_record.id");
static_assert(GOEP_OFFSETOF(goep_timeout_record, peer) == 12, "goep: goep_timeout_record.peer");
static_assert(GOEP_OFFSETOF(goep_timeout_record, stage) == 16, "goep: goep_timeout_record.stage");
static_assert(GOEP_OFFSETOF(goep_timeout_record, waited_ns) == 24, "goep: goep_timeout_record.waited_ns");
static_assert(GOEP_OFFSETOF(goep_timeout_record, expected) == 32, "goep: goep_timeout_record.expected");
static_assert(GOEP_OFFSETOF(goep_timeout_record, observed) == 40, "goep: goep_timeout_record.observed");

// ---------------------------------------------------------------------------
// Watchdog: one per communicator, in device memory (spins read it often, so
// it must not be across PCIe). abort doubles as the claim on the record: the
// thread that moves it from 0 to GOEP_ABORT_TIMEOUT fills the record; every
// other spin that sees it non-zero gives up at once, so one expired wait
// ends the whole launch (and every later launch that uses the communicator,
// which the host refuses anyway until Close).

enum {
  GOEP_ABORT_NONE = 0,
  GOEP_ABORT_TIMEOUT = 1,  // set by the device thread that timed out
  GOEP_ABORT_HOST = 2,     // set by the host (Communicator.Abort)
};

struct goep_watchdog {
  u64 timeout_ns;               // bound of every spin, from the GPU global timer
  goep_timeout_record* record;  // host-mapped
  u32 abort;                    // GOEP_ABORT_*
  u32 reserved0;
  u64 reserved1;
};
static_assert(sizeof(goep_watchdog) == 32, "goep: goep_watchdog layout");
static_assert(GOEP_OFFSETOF(goep_watchdog, timeout_ns) == 0, "goep: goep_watchdog.timeout_ns");
static_assert(GOEP_OFFSETOF(goep_watchdog, record) == 8, "goep: goep_watchdog.record");
static_assert(GOEP_OFFSETOF(goep_watchdog, abort) == 16, "goep: goep_watchdog.abort");

// ---------------------------------------------------------------------------
// Semaphore (device-to-device and host-to-device). Tokens are monotonic
// 64-bit counters:
//   inbound:  this rank's token; the peer adds to it (device-to-device) or
//             the peer's host stores ever larger values into it
//             (host-to-device). Lives in this rank's registered memory.
//   expected: how many signals this rank has consumed; advanced by wait and
//             poll. Device memory of this rank, touched by one thread at a
//             time.
//   remote:   the peer's inbound token for this pair, mapped over NVLink;
//             0 for a host-to-device semaphore (the device cannot signal).
struct goep_semaphore {
  u64* inbound;
  u64* expected;
  u64* remote;
  goep_watchdog* wd;
  u32 peer;  // peer rank, for timeout records
  u32 id;    // communicator-wide id of the semaphore or channel
  u64 reserved;
};
static_assert(sizeof(goep_semaphore) == 48, "goep: goep_semaphore layout");
static_assert(GOEP_OFFSETOF(goep_semaphore, inbound) == 0, "goep: goep_semaphore.inbound");
static_assert(GOEP_OFFSETOF(goep_semaphore, expected) == 8, "goep: goep_semaphore.expected");
static_assert(GOEP_OFFSETOF(goep_semaphore, remote) == 16, "goep: goep_semaphore.remote");
static_assert(GOEP_OFFSETOF(goep_semaphore, wd) == 24, "goep: goep_semaphore.wd");
static_assert(GOEP_OFFSETOF(goep_semaphore, peer) == 32, "goep: goep_semaphore.peer");
static_assert(GOEP_OFFSETOF(goep_semaphore, id) == 36, "goep: goep_semaphore.id");

// ---------------------------------------------------------------------------
// LL packets. A packet carries its flag next to its payload, so a reader
// knows the payload is there without any other synchronisation, and memory
// never needs clearing: each launch uses a new flag.

// LL16: 8-byte payload in two 4-byte halves, each followed by the flag; one
// 16-byte vector store writes it. A reader accepts it when both flags match,
// so it needs only each 8-byte half to arrive whole, not the 16 bytes.
struct alignas(16) goep_ll16 {
  u32 data1;
  u32 flag1;
  u32 data2;
  u32 flag2;
};
static_assert(sizeof(goep_ll16) == 16, "goep: goep_ll16 layout");
static_assert(GOEP_OFFSETOF(goep_ll16, flag1) == 4, "goep: goep_ll16.flag1");
static_assert(GOEP_OFFSETOF(goep_ll16, data2) == 8, "goep: goep_ll16.data2");
static_assert(GOEP_OFFSETOF(goep_ll16, flag2) == 12, "goep: goep_ll16.flag2");

// LL8: 4-byte payload, one 8-byte store.
struct alignas(8) goep_ll8 {
  u32 data;
  u32 flag;
};
static_assert(sizeof(goep_ll8) == 8, "goep: goep_ll8 layout");
static_assert(GOEP_OFFSETOF(goep_ll8, flag) == 4, "goep: goep_ll8.flag");

// Flag counter of one packet (scratch) buffer, in device memory. A kernel
// reads value at its start and uses value+1 (goep_ll_flag_begin); the last
// of its blocks to finish stores that back (goep_ll_flag_end), counting
// arrivals in arrived. Both ranks of a channel advance their own counters
// once per launch of the same kernel, so they agree without talking.
struct goep_ll_flag {
  u32 value;
  u32 arrived;
};
static_assert(sizeof(goep_ll_flag) == 8, "goep: goep_ll_flag layout");
static_assert(GOEP_OFFSETOF(goep_ll_flag, arrived) == 4, "goep: goep_ll_flag.arrived");

// ---------------------------------------------------------------------------
// Memory channel: a semaphore plus the memory it moves data between.
//   remote:         the peer's registered memory (put writes, get reads)
//   local:          this rank's registered memory (put reads, get and
//                   unpack write)
//   remote_packets: the peer's packet buffer (put_packets writes)
//   local_packets:  this rank's packet buffer (unpack reads)
//   flag:           local_packets' flag counter
// Any of them may be 0 when the channel does not use it.
struct goep_memory_channel {
  goep_semaphore sem;
  char* remote;
  char* local;
  char* remote_packets;
  char* local_packets;
  goep_ll_flag* flag;
  u64 remote_size;
  u64 local_size;
  u64 remote_packets_size;
  u64 local_packets_size;
  u64 reserved;
};
static_assert(sizeof(goep_memory_channel) == 128, "goep: goep_memory_channel layout");
static_assert(GOEP_OFFSETOF(goep_memory_channel, sem) == 0, "goep: goep_memory_channel.sem");
static_assert(GOEP_OFFSETOF(goep_memory_channel, remote) == 48, "goep: goep_memory_channel.remote");
static_assert(GOEP_OFFSETOF(goep_memory_channel, local) == 56, "goep: goep_memory_channel.local");
static_assert(GOEP_OFFSETOF(goep_memory_channel, remote_packets) == 64, "goep: goep_memory_channel.remote_packets");
static_assert(GOEP_OFFSETOF(goep_memory_channel, local_packets) == 72, "goep: goep_memory_channel.local_packets");
static_assert(GOEP_OFFSETOF(goep_memory_channel, flag) == 80, "goep: goep_memory_channel.flag");
static_assert(GOEP_OFFSETOF(goep_memory_channel, remote_size) == 88, "goep: goep_memory_channel.remote_size");
static_assert(GOEP_OFFSETOF(goep_memory_channel, local_size) == 96, "goep: goep_memory_channel.local_size");
static_assert(GOEP_OFFSETOF(goep_memory_channel, remote_packets_size) == 104,
              "goep: goep_memory_channel.remote_packets_size");
static_assert(GOEP_OFFSETOF(goep_memory_channel, local_packets_size) == 112,
              "goep: goep_memory_channel.local_packets_size");

// ---------------------------------------------------------------------------
// Port channels: GPU threads push 16-byte triggers into a FIFO that a CPU
// proxy drains (fifo_device.cuh, port_device.cuh; the proxy is
// channels/proxy.go).
//
// FIFO. triggers is a ring of size slots (a power of two) of two u64 words
// in pinned host memory mapped into the device, so the proxy polls it
// without crossing PCIe. A pusher claims position pos with an atomic add on
// head (device memory), waits until the slot's previous occupant has been
// consumed (pos < tail + size; tail is the proxy's count of consumed
// triggers, pinned host memory, cached in tail_cache in device memory so
// that a pusher reads across PCIe only when the ring looks full), then
// stores both words. Bit 63 of each word is the commit bit: 1 on even laps
// of the ring (pos / size even), 0 on odd ones; the ring starts zeroed, so a
// slot is ready for position pos exactly when both of its words carry pos's
// parity, and the proxy never clears a slot. Checking both words means a
// 16-byte store that reaches host memory as two 8-byte halves is never read
// half old, half new. done is the position + 1 of the last flush the proxy
// completed (pinned host memory): a flush at pos waits for done > pos.
struct goep_fifo {
  u64* triggers;    // 2 * size words, pinned host memory
  u64* head;        // next position to claim, device memory
  u64* tail;        // triggers consumed by the proxy, pinned host memory
  u64* tail_cache;  // a recent value of tail, device memory
  u64* done;        // 1 + position of the last completed flush, pinned host memory
  goep_watchdog* wd;
  u32 size;  // slots, a power of two
  u32 reserved0;
  u64 reserved1;
};
static_assert(sizeof(goep_fifo) == 64, "goep: goep_fifo layout");
static_assert(GOEP_OFFSETOF(goep_fifo, triggers) == 0, "goep: goep_fifo.triggers");
static_assert(GOEP_OFFSETOF(goep_fifo, head) == 8, "goep: goep_fifo.head");
static_assert(GOEP_OFFSETOF(goep_fifo, tail) == 16, "goep: goep_fifo.tail");
static_assert(GOEP_OFFSETOF(goep_fifo, tail_cache) == 24, "goep: goep_fifo.tail_cache");
static_assert(GOEP_OFFSETOF(goep_fifo, done) == 32, "goep: goep_fifo.done");
static_assert(GOEP_OFFSETOF(goep_fifo, wd) == 40, "goep: goep_fifo.wd");
static_assert(GOEP_OFFSETOF(goep_fifo, size) == 48, "goep: goep_fifo.size");

// Trigger, two words (bit 63 of each is the commit bit, see above):
//   word 0: bits 0..31  src offset        (word ops: value bits 0..31)
//           bits 32..62 size in bytes     (word ops: value bits 32..62)
//   word 1: bits 0..31  dst offset
//           bits 32..35 type: GOEP_TRIGGER_* ORed (put, signal, flush), or
//                       a word op alone: GOEP_TRIGGER_ATOMIC_ADD or
//                       GOEP_TRIGGER_STORE (bit 3 set)
//           bits 36..45 channel: the proxy's index of the port channel
//           bits 46..53 dst memory id     bits 54..61 src memory id
//                                         (word ops: bit 54 is value bit 63)
//           bit 62      zero
// Offsets are below 4 GiB and one put moves less than 2 GiB (the device API
// splits larger puts).
enum {
  GOEP_TRIGGER_PUT = 1,
  GOEP_TRIGGER_SIGNAL = 2,
  GOEP_TRIGGER_FLUSH = 4,
  GOEP_TRIGGER_ATOMIC_ADD = 8,
  // Stores a 64-bit value into a word of the peer's memory after the
  // channel's earlier puts (the connection's UpdateAndSync: a stream write
  // over CUDA IPC, where an atomic add is a kernel launch).
  GOEP_TRIGGER_STORE = 9,
};
#define GOEP_TRIGGER_COMMIT (1ull << 63)
#define GOEP_TRIGGER_MAX_SIZE ((1ull << 31) - 1)
#define GOEP_TRIGGER_MAX_CHANNELS 1024
#define GOEP_TRIGGER_MAX_MEMORIES 256

// Port channel: the proxy's FIFO, the host-to-device semaphore the peer's
// proxy signals (sem.remote is 0: only the proxy signals, on a trigger),
// the channel's index in the proxy and its default memory ids (dst: the
// peer's memory puts write; src: this rank's memory they read).
struct goep_port_channel {
  goep_fifo fifo;
  goep_semaphore sem;
  u32 channel;
  u32 dst;
  u32 src;
  u32 reserved0;
};
static_assert(sizeof(goep_port_channel) == 128, "goep: goep_port_channel layout");
static_assert(GOEP_OFFSETOF(goep_port_channel, fifo) == 0, "goep: goep_port_channel.fifo");
static_assert(GOEP_OFFSETOF(goep_port_channel, sem) == 64, "goep: goep_port_channel.sem");
static_assert(GOEP_OFFSETOF(goep_port_channel, channel) == 112, "goep: goep_port_channel.channel");
static_assert(GOEP_OFFSETOF(goep_port_channel, dst) == 116, "goep: goep_port_channel.dst");
static_assert(GOEP_OFFSETOF(goep_port_channel, src) == 120, "goep: goep_port_channel.src");

#endif  // GOEP_CHANNEL_ABI_CUH
