// Package fakenccl builds a host-memory stand-in for libnccl, so the NCCL
// fallback is tested without GPUs.
package fakenccl
