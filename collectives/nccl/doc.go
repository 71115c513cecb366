// Package nccl loads libnccl at run time and wraps the calls goep uses (the
// collectives' fallback and comparison).
package nccl
