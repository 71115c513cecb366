// Package nccltest gives tests outside collectives/ the host-memory NCCL
// stand-in (collectives/internal/fakenccl).
package nccltest
