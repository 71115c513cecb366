package spawn

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// groupAlive reports whether process group pgid has a member that is not a
// zombie. kill(-pgid, 0) alone would count zombies, and orphans that died
// stay zombies for good where PID 1 does not reap (common in containers),
// which would make every shutdown wait out the whole grace period.
func groupAlive(pgid int) bool {
	if syscall.Kill(-pgid, 0) != nil {
		return false // no member at all (or not ours to signal)
	}
	d, err := os.Open("/proc")
	if err != nil {
		return true
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return true
	}
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		stat, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		// "pid (comm) state ppid pgrp ...": comm may contain anything, so
		// parse from the last ')'.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(stat[i+1:])
		if len(f) < 3 {
			continue
		}
		if g, _ := strconv.Atoi(string(f[2])); g == pgid && f[0][0] != 'Z' && f[0][0] != 'X' {
			return true
		}
	}
	return false
}
