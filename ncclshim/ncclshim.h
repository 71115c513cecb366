// Copyright the goep authors.
//
// ncclshim.h declares, in our own names (prefix gs), the NCCL ABI that
// libgoep_nccl.so implements, written from NCCL's documented C API (LP64
// Linux): ncclResult_t, ncclDataType_t and ncclRedOp_t are int-sized enums,
// ncclComm_t is a pointer, ncclUniqueId a 128-byte struct passed by value,
// cudaStream_t a pointer. testdata/abicheck.c compares these with a real
// nccl.h (TestABIAgainstHeader). No NCCL header is included here.
#ifndef GOEP_NCCLSHIM_H
#define GOEP_NCCLSHIM_H

#include <stddef.h>
#include <stdint.h>

#define GS_UNIQUE_ID_BYTES 128

typedef int gsResult;   // ncclResult_t
typedef int gsDataType; // ncclDataType_t
typedef int gsRedOp;    // ncclRedOp_t
typedef void *gsStream; // cudaStream_t

typedef struct {
	char internal[GS_UNIQUE_ID_BYTES];
} gsUniqueId; // ncclUniqueId

// The head of ncclConfig_t, the fields every NCCL version since 2.14 has
// at these offsets; the shim reads nothing else (the struct grows with
// every release and its size is its first field).
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
} gsConfigHead;

#define GS_CONFIG_MAGIC 0xcafebeefu // NCCL_API_MAGIC

// ncclResult_t values.
#define GS_SUCCESS 0
#define GS_UNHANDLED_CUDA_ERROR 1
#define GS_SYSTEM_ERROR 2
#define GS_INTERNAL_ERROR 3
#define GS_INVALID_ARGUMENT 4
#define GS_INVALID_USAGE 5
#define GS_REMOTE_ERROR 6
#define GS_IN_PROGRESS 7
#define GS_TIMEOUT 8
#define GS_NUM_RESULTS 9

// Kinds of goepNcclCall (ncclshim/core.Kind).
#define GS_ALLREDUCE 0
#define GS_ALLGATHER 1
#define GS_REDUCESCATTER 2
#define GS_BROADCAST 3
#define GS_REDUCE 4
#define GS_SEND 5
#define GS_RECV 6
#define GS_ALLTOALL 7
#define GS_GATHER 8
#define GS_SCATTER 9

// The version the shim reports: NCCL 2.21.5's API (what PyTorch 2.x
// expects at least), with goep's own numbering kept out of the way.
#define GS_VERSION_CODE 22105

// A communicator handle: ncclComm_t points at one. The magic catches
// handles that are not the shim's (a real NCCL's, or freed ones).
#define GS_COMM_MAGIC 0x676f65704e43434cull // "goepNCCL"
typedef struct gs_comm {
	uint64_t magic;
	uint64_t id; // the Go side's communicator
} gs_comm;

#endif // GOEP_NCCLSHIM_H
