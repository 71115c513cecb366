// abicheck.c compares ncclshim.h and the shim's enumerators with a real
// nccl.h at compile time. It is not part of the build (go ignores
// testdata/); TestABIAgainstHeader compiles it when a header is found
// ($GOEP_NCCL_INCLUDE, or a pip wheel's nvidia/nccl/include), with stand-in
// CUDA headers when no CUDA toolkit is installed:
//
//   GOEP_NCCL_INCLUDE=/path/to/nccl/include go test -run TestABIAgainstHeader -v ./ncclshim
#include <stddef.h>
#include <nccl.h>

#include "ncclshim.h"
#include "abicheck_values.h" // the Go side's enumerators, written by the test

#define SAME(a, b) _Static_assert((a) == (b), #a " != " #b)

// Types and layouts.
SAME(sizeof(ncclUniqueId), sizeof(gsUniqueId));
SAME(sizeof(ncclUniqueId), 128);
SAME(NCCL_UNIQUE_ID_BYTES, GS_UNIQUE_ID_BYTES);
SAME(sizeof(ncclResult_t), sizeof(gsResult));
SAME(sizeof(ncclDataType_t), sizeof(gsDataType));
SAME(sizeof(ncclRedOp_t), sizeof(gsRedOp));
SAME(sizeof(ncclComm_t), sizeof(void *));
SAME(sizeof(cudaStream_t), sizeof(gsStream));
SAME(offsetof(ncclConfig_t, size), offsetof(gsConfigHead, size));
SAME(offsetof(ncclConfig_t, magic), offsetof(gsConfigHead, magic));
SAME(offsetof(ncclConfig_t, version), offsetof(gsConfigHead, version));
SAME(offsetof(ncclConfig_t, blocking), offsetof(gsConfigHead, blocking));
SAME(NCCL_API_MAGIC, GS_CONFIG_MAGIC);

// Results (C and Go).
SAME(ncclSuccess, GS_SUCCESS);
SAME(ncclUnhandledCudaError, GS_UNHANDLED_CUDA_ERROR);
SAME(ncclSystemError, GS_SYSTEM_ERROR);
SAME(ncclInternalError, GS_INTERNAL_ERROR);
SAME(ncclInvalidArgument, GS_INVALID_ARGUMENT);
SAME(ncclInvalidUsage, GS_INVALID_USAGE);
SAME(ncclRemoteError, GS_REMOTE_ERROR);
SAME(ncclInProgress, GS_IN_PROGRESS);
SAME(ncclSuccess, GO_Success);
SAME(ncclUnhandledCudaError, GO_UnhandledCudaError);
SAME(ncclSystemError, GO_SystemError);
SAME(ncclInternalError, GO_InternalError);
SAME(ncclInvalidArgument, GO_InvalidArgument);
SAME(ncclInvalidUsage, GO_InvalidUsage);
SAME(ncclRemoteError, GO_RemoteError);
SAME(ncclInProgress, GO_InProgress);

// Data types and reductions (Go).
SAME(ncclInt8, GO_Int8);
SAME(ncclUint8, GO_Uint8);
SAME(ncclInt32, GO_Int32);
SAME(ncclUint32, GO_Uint32);
SAME(ncclInt64, GO_Int64);
SAME(ncclUint64, GO_Uint64);
SAME(ncclFloat16, GO_Float16);
SAME(ncclFloat32, GO_Float32);
SAME(ncclFloat64, GO_Float64);
SAME(ncclBfloat16, GO_Bfloat16);
#if NCCL_VERSION_CODE >= 22400
SAME(ncclFloat8e4m3, GO_Float8e4m3);
SAME(ncclFloat8e5m2, GO_Float8e5m2);
SAME(ncclNumTypes, GO_numTypes);
#endif
SAME(ncclSum, GO_Sum);
SAME(ncclProd, GO_Prod);
SAME(ncclMax, GO_Max);
SAME(ncclMin, GO_Min);
SAME(ncclAvg, GO_Avg);
SAME(ncclNumOps, GO_numOps);

int main(void) { return 0; }
