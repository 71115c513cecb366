//go:build !linux

package bootstrap

import (
	"context"
	"errors"
	"time"
)

// FDExchanger passes file descriptors between ranks of one host; it needs
// Linux (abstract Unix sockets, SO_PEERCRED).
type FDExchanger struct{}

// MaxFDsPerMessage is the kernel's limit on descriptors in one SCM_RIGHTS message.
const MaxFDsPerMessage = 253

var errFDLinuxOnly = errors.New("bootstrap: file descriptor passing needs Linux")

func NewFDExchanger(ctx context.Context, b Bootstrap, timeout time.Duration) (*FDExchanger, error) {
	return nil, errFDLinuxOnly
}

func (x *FDExchanger) SendFD(ctx context.Context, peer, tag int, fds []int) error {
	return errFDLinuxOnly
}

func (x *FDExchanger) RecvFD(ctx context.Context, peer, tag int) ([]int, error) {
	return nil, errFDLinuxOnly
}

func (x *FDExchanger) Close() error { return nil }
