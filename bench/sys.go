package bench

import "syscall"

func syscallClose(fd int) { _ = syscall.Close(fd) }
