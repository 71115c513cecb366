package core

import (
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"syscall"
)

// Result is an ncclResult_t.
type Result int

// NCCL's result codes (nccl.h; values checked by the ABI test).
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8
)

// Error is a failed call: the code NCCL would return and what went wrong.
type Error struct {
	Code Result
	Msg  string
}

func (e *Error) Error() string {
	if e == nil {
		return "ncclshim: nil *Error"
	}
	return e.Msg
}

func errorf(code Result, format string, a ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, a...)}
}

// logger writes the shim's lines to stderr, prefixed so users see where
// they come from.
var logger = log.New(os.Stderr, "goep-nccl: ", 0)

// Logf writes one line to stderr.
func Logf(format string, a ...any) { logger.Printf(format, a...) }

// The last error of each OS thread: C callers of the shim run its Go code
// on their own thread, so a thread sees its own calls' errors.
var (
	lastMu  sync.Mutex
	lastErr = map[int]string{}
)

// Fail records err as the last error (ncclGetLastError) and returns its
// code (Success for nil). Invalid usage is also logged: NCCL programs often
// print only the code.
func Fail(err error) Result {
	if err == nil {
		return Success
	}
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Code: InternalError, Msg: err.Error()}
	}
	lastMu.Lock()
	lastErr[syscall.Gettid()] = e.Msg
	lastMu.Unlock()
	if e.Code == InvalidUsage || os.Getenv(EnvDebug) != "" {
		Logf("%s", e.Msg)
	}
	return e.Code
}

// LastError is the message of the calling OS thread's last failed call.
func LastError() string {
	lastMu.Lock()
	defer lastMu.Unlock()
	return lastErr[syscall.Gettid()]
}

// Unsupported is the answer to an NCCL call goep neither implements nor
// forwards: ncclInvalidUsage, with a line naming the call.
func Unsupported(call string) Result {
	return Fail(errorf(InvalidUsage, "%s is not supported by goep's NCCL shim (and has no fallback)", call))
}
