package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestErrorFormat(t *testing.T) {
	e := &Error{Op: "cuMemAlloc", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Msg: "out of memory"}
	assert.Equal(t, "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory", e.Error())

	noMsg := &Error{Op: "cuStreamQuery", Code: 400, Name: "CUDA_ERROR_INVALID_HANDLE"}
	assert.Equal(t, "cuStreamQuery: CUDA_ERROR_INVALID_HANDLE (400)", noMsg.Error())

	noName := &Error{Op: "cuFoo", Code: 12345}
	assert.Equal(t, "cuFoo: CUDA_ERROR_12345 (12345)", noName.Error())
}

func TestErrorIsCode(t *testing.T) {
	var err error = &Error{Op: "cuEventQuery", Code: int(ErrNotReady), Name: "CUDA_ERROR_NOT_READY"}
	wrapped := fmt.Errorf("waiting: %w", err)
	assert.True(t, errors.Is(wrapped, ErrNotReady))
	assert.True(t, IsCode(wrapped, ErrNotReady))
	assert.False(t, errors.Is(wrapped, ErrOutOfMemory))
	assert.False(t, IsCode(errors.New("other"), ErrNotReady))

	var ce *Error
	require.True(t, errors.As(wrapped, &ce))
	assert.Equal(t, "cuEventQuery", ce.Op)
}

func TestNewErrorNames(t *testing.T) {
	// Works with or without a driver: names come from cuGetErrorName when
	// loaded, else from the package's table.
	err := newError("cuMemAlloc", 2)
	var ce *Error
	require.True(t, errors.As(err, &ce))
	assert.Equal(t, 2, ce.Code)
	assert.Equal(t, "CUDA_ERROR_OUT_OF_MEMORY", ce.Name)
	assert.Contains(t, err.Error(), "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (2)")
	assert.True(t, errors.Is(err, ErrOutOfMemory))

	assert.Nil(t, check("cuInit", 0))
	assert.Error(t, check("cuInit", 100))
	assert.Equal(t, "CUDA_ERROR_NOT_READY (600)", ErrNotReady.Error())
	assert.Equal(t, "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED", ErrPeerAccessAlreadyEnabled.Name())
}

func TestCodeNamesComplete(t *testing.T) {
	for _, c := range []Code{Success, ErrInvalidValue, ErrOutOfMemory, ErrNotInitialized, ErrDeinitialized,
		ErrNoDevice, ErrInvalidDevice, ErrInvalidImage, ErrInvalidContext, ErrNoBinaryForGPU,
		ErrPeerAccessUnsupported, ErrInvalidPTX, ErrUnsupportedPTXVersion, ErrInvalidHandle, ErrNotFound,
		ErrNotReady, ErrIllegalAddress, ErrLaunchOutOfResources, ErrLaunchTimeout,
		ErrPeerAccessAlreadyEnabled, ErrPeerAccessNotEnabled, ErrLaunchFailed,
		ErrCooperativeLaunchTooLarge, ErrNotPermitted, ErrNotSupported, ErrStreamCaptureUnsupported,
		ErrStreamCaptureInvalidated, ErrStreamCaptureWrongThread, ErrUnknown} {
		assert.Contains(t, codeNames, c, "code %d has no fallback name", int(c))
	}
}
