// plan_abi.cuh: the packed form of a resolved execution plan
// (collectives/plan.Resolved) that the GPU interpreter (plan_exec.cu) runs.
// collectives/plan/gpu writes these structs; their layouts are checked on
// both sides (static_asserts here, layout tests there).
//
// One rank's launch has one CUDA block per plan threadblock. Block b runs
// instrs[blocks[b].first, +blocks[b].count) in order; a pipeline
// instruction is followed by its body (body instructions), which it runs
// iterations times. Channel and buffer numbers in an instruction index the
// block's tables, which hold rank-level indices into the context's arrays.
#ifndef GOEP_PLAN_ABI_CUH
#define GOEP_PLAN_ABI_CUH

#include "channel_abi.cuh"

#define GOEP_PLAN_MAX_OPERANDS 10
#define GOEP_PLAN_MAX_OP_CHANNELS 8
#define GOEP_PLAN_MAX_SEMS 16
#define GOEP_PLAN_TABLE 16
#define GOEP_PLAN_MAX_BARRIERS 16

// Opcodes: the values of collectives/plan.Opcode.
enum goep_plan_opcode : u8 {
  GOEP_PLAN_NOP = 0,
  GOEP_PLAN_BARRIER,
  GOEP_PLAN_SIGNAL,
  GOEP_PLAN_WAIT,
  GOEP_PLAN_RLX_SIGNAL,
  GOEP_PLAN_RLX_WAIT,
  GOEP_PLAN_FLUSH,
  GOEP_PLAN_PUT,
  GOEP_PLAN_PWS,
  GOEP_PLAN_PWSF,
  GOEP_PLAN_GET,
  GOEP_PLAN_COPY,
  GOEP_PLAN_RE,
  GOEP_PLAN_RES,
  GOEP_PLAN_RRE,
  GOEP_PLAN_RRES,
  GOEP_PLAN_PPKT,
  GOEP_PLAN_RPPKT,
  GOEP_PLAN_CPKT,
  GOEP_PLAN_UPKT,
  GOEP_PLAN_REPKT,
  GOEP_PLAN_RESPKT,
  GOEP_PLAN_RECPKT,
  GOEP_PLAN_RECSPKT,
  GOEP_PLAN_GLRES,
  GOEP_PLAN_GSTORE,
  GOEP_PLAN_GSTOREPKT,
  GOEP_PLAN_SEM_ACQUIRE,
  GOEP_PLAN_SEM_RELEASE,
  GOEP_PLAN_PIPELINE,
};

// Channel types and buffer kinds: collectives/plan.ChannelType, .BufKind.
enum : u8 { GOEP_PLAN_CHAN_NONE = 0, GOEP_PLAN_CHAN_MEMORY = 1, GOEP_PLAN_CHAN_PORT = 2, GOEP_PLAN_CHAN_SWITCH = 3 };
enum : u8 {
  GOEP_PLAN_BUF_INPUT = 0,
  GOEP_PLAN_BUF_OUTPUT = 1,
  GOEP_PLAN_BUF_SCRATCH = 2,
  GOEP_PLAN_BUF_REMOTE_MEMORY = 3,
  GOEP_PLAN_BUF_REMOTE_PORT = 4,
};
enum : u8 { GOEP_PLAN_SUM = 0, GOEP_PLAN_MIN = 1, GOEP_PLAN_MAX = 2 };
enum : u32 { GOEP_PLAN_BF16 = 0, GOEP_PLAN_FP16 = 1, GOEP_PLAN_FP32 = 2, GOEP_PLAN_INT32 = 3 };

// A byte range of a buffer. Reads past valid are zeros, writes past it are
// dropped; packet ranges (packets != 0) start at offset in packet bytes and
// carry size payload bytes.
struct goep_plan_operand {
  u64 offset;
  u64 size;
  u64 valid;
  u8 kind;    // GOEP_PLAN_BUF_*
  u8 remote;  // remote kinds: index into the block's membuf / portbuf table
  u8 target;  // the buffer addressed: input, output or scratch
  u8 packets;
  u32 reserved;
};
static_assert(sizeof(goep_plan_operand) == 32, "goep: goep_plan_operand layout");

struct goep_plan_instr {
  u8 code;
  u8 chan;
  u8 reduce;
  u8 nchannels;
  u8 nsrc;
  u8 ndst;
  u8 barrier_id;
  u8 nsems;
  u16 barrier_blocks;
  u16 body;        // pipeline: the body instructions that follow
  u32 op_index;    // for timeout records: the plan's op index
  u64 unit;        // pipeline: bytes per iteration
  u64 iterations;  // pipeline: iterations
  u8 channels[GOEP_PLAN_MAX_OP_CHANNELS];
  u8 sems[GOEP_PLAN_MAX_SEMS];
  u32 body_index;  // index in the pipeline body, 0xffffffff outside one
  u32 reserved;
  goep_plan_operand src[GOEP_PLAN_MAX_OPERANDS];
  goep_plan_operand dst[GOEP_PLAN_MAX_OPERANDS];
};
static_assert(sizeof(goep_plan_instr) == 704, "goep: goep_plan_instr layout");
static_assert(GOEP_OFFSETOF(goep_plan_instr, unit) == 16, "goep: goep_plan_instr.unit");
static_assert(GOEP_OFFSETOF(goep_plan_instr, channels) == 32, "goep: goep_plan_instr.channels");
static_assert(GOEP_OFFSETOF(goep_plan_instr, src) == 64, "goep: goep_plan_instr.src");

// A block's program and tables (rank-level indices).
struct goep_plan_block {
  u32 first;
  u32 count;
  u16 mem_chans[GOEP_PLAN_TABLE];
  u16 port_chans[GOEP_PLAN_TABLE];
  u16 mem_bufs[GOEP_PLAN_TABLE];
  u16 port_bufs[GOEP_PLAN_TABLE];
};
static_assert(sizeof(goep_plan_block) == 136, "goep: goep_plan_block layout");

// One rank's launch context (all fields 8 bytes: pointers as u64).
struct goep_plan_ctx {
  u64 input;             // char*
  u64 output;            // char*
  u64 scratch;           // char*
  u64 scratch_half;      // offset of this rank's second scratch half (0: one half)
  u64 blocks;            // const goep_plan_block*
  u64 instrs;            // const goep_plan_instr*
  u64 mem_sems;          // const goep_semaphore*, per rank-level memory channel
  u64 ports;             // const goep_port_channel*, per rank-level port channel
  u64 remote_ptrs;       // char* const*, per remote buffer (memory access)
  u64 remote_halves;     // const u64*, per remote buffer: its owner's scratch half offset
  u64 remote_port_ids;   // const u32*, per remote buffer: proxy memory id (port access)
  u64 local_port_ids;    // u32 input | u32 output << 32
  u64 scratch_port_id;   // u32
  u64 sems;              // long long*, the plan's semaphores
  u64 barriers;          // u64*, GOEP_PLAN_MAX_BARRIERS counters
  u64 flag;              // goep_ll_flag*
  u64 wd;                // goep_watchdog*
  u64 packet_type;       // 16 (LL16) or 8 (LL8)
  u64 smem_instrs;       // instructions a block may copy into shared memory (0: read from global)
};
static_assert(sizeof(goep_plan_ctx) == 19 * 8, "goep: goep_plan_ctx layout");

#endif  // GOEP_PLAN_ABI_CUH
