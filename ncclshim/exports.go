package main

/*
#include <stdint.h>
#include <string.h>
#include "ncclshim.h"
*/
import "C"

import (
	"slices"
	"sync"
	"unsafe"

	"github.com/goep-dev/goep/collectives/nccl"
	"github.com/goep-dev/goep/ncclshim/core"
)

// comms maps the C handles' ids to communicators.
var comms struct {
	sync.Mutex
	next uint64
	m    map[uint64]*core.Comm
}

func addComm(c *core.Comm) uint64 {
	comms.Lock()
	defer comms.Unlock()
	if comms.m == nil {
		comms.m = map[uint64]*core.Comm{}
	}
	comms.next++
	comms.m[comms.next] = c
	return comms.next
}

func getComm(id C.uint64_t) *core.Comm {
	comms.Lock()
	defer comms.Unlock()
	return comms.m[uint64(id)]
}

func dropComm(id C.uint64_t) *core.Comm {
	comms.Lock()
	defer comms.Unlock()
	c := comms.m[uint64(id)]
	delete(comms.m, uint64(id))
	return c
}

func result(err error) C.int { return C.int(core.Fail(err)) }

var noComm = &core.Error{Code: core.InvalidArgument, Msg: "not a live goep communicator"}

//export goepNcclFail
func goepNcclFail(code C.int, msg *C.char) C.int {
	return result(&core.Error{Code: core.Result(code), Msg: C.GoString(msg)})
}

//export goepNcclUnsupported
func goepNcclUnsupported(name *C.char) C.int { return C.int(core.Unsupported(C.GoString(name))) }

//export goepNcclLastError
func goepNcclLastError(buf *C.char, n C.int) {
	if buf == nil || n <= 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	m := copy(b[:len(b)-1], core.LastError())
	b[m] = 0
}

// goepNcclVersion is the real NCCL's version when one can be loaded (the
// program asks what it may use, and everything the shim does not run
// itself goes there), else def.
//
//export goepNcclVersion
func goepNcclVersion(def C.int) C.int {
	if lib, err := nccl.Load(); err == nil {
		return C.int(lib.Version)
	}
	return def
}

//export goepNcclGetUniqueId
func goepNcclGetUniqueId(out *C.char) C.int {
	id, err := core.NewUniqueID()
	if err != nil {
		return result(err)
	}
	C.memcpy(unsafe.Pointer(out), unsafe.Pointer(&id[0]), C.size_t(len(id)))
	return 0
}

//export goepNcclCommInitRank
func goepNcclCommInitRank(tid C.uint64_t, out *C.uint64_t, nranks C.int, id *C.char, rank C.int) C.int {
	if core.InGroup(uint64(tid)) {
		return C.int(core.Unsupported("ncclCommInitRank inside ncclGroupStart/ncclGroupEnd"))
	}
	var uid core.UniqueID
	copy(uid[:], unsafe.Slice((*byte)(unsafe.Pointer(id)), len(uid)))
	c, err := core.Init(uid, int(nranks), int(rank))
	if err != nil {
		return result(err)
	}
	*out = C.uint64_t(addComm(c))
	return 0
}

//export goepNcclCommInitAll
func goepNcclCommInitAll(out *C.uint64_t, ndev C.int, devlist *C.int) C.int {
	var list []int
	if devlist != nil {
		for _, d := range unsafe.Slice(devlist, int(ndev)) {
			list = append(list, int(d))
		}
	}
	cs, err := core.InitAll(int(ndev), list)
	if err != nil {
		return result(err)
	}
	ids := unsafe.Slice(out, int(ndev))
	for i, c := range cs {
		ids[i] = C.uint64_t(addComm(c))
	}
	return 0
}

//export goepNcclCommSplit
func goepNcclCommSplit(id C.uint64_t, color, key C.int, out *C.uint64_t) C.int {
	*out = 0
	c := getComm(id)
	if c == nil {
		return result(noComm)
	}
	n, err := c.Split(int(color), int(key))
	if err != nil {
		return result(err)
	}
	if n != nil {
		*out = C.uint64_t(addComm(n))
	}
	return 0
}

// goepNcclCommEnd finalizes (how 0), destroys (1) or aborts (2).
//
//export goepNcclCommEnd
func goepNcclCommEnd(id C.uint64_t, how C.int) C.int {
	if how == 0 {
		c := getComm(id)
		if c == nil {
			return result(noComm)
		}
		return result(c.Finalize())
	}
	c := dropComm(id)
	if c == nil {
		return result(noComm)
	}
	if how == 1 {
		return result(c.Destroy())
	}
	return result(c.Abort())
}

// goepNcclCommQuery answers count (0), device (1), rank (2) and async
// error (3).
//
//export goepNcclCommQuery
func goepNcclCommQuery(id C.uint64_t, what C.int, out *C.int) C.int {
	c := getComm(id)
	if c == nil {
		return result(noComm)
	}
	switch what {
	case 0:
		*out = C.int(c.Size())
	case 1:
		*out = C.int(c.Device())
	case 2:
		*out = C.int(c.Rank())
	case 3:
		*out = 0
		if err := c.AsyncError(); err != nil {
			*out = C.int(core.Fail(err))
		}
	}
	return 0
}

//export goepNcclCall
func goepNcclCall(tid, id C.uint64_t, kind C.int, send, recv C.uintptr_t, count C.size_t, dt, op, root C.int, stream C.uintptr_t) C.int {
	c := getComm(id)
	if c == nil {
		return result(noComm)
	}
	return result(c.Do(uint64(tid), core.Call{Kind: core.Kind(kind), Send: uintptr(send), Recv: uintptr(recv),
		Count: uint64(count), Type: core.DataType(dt), Op: core.RedOp(op), Root: int(root), Stream: uintptr(stream)}))
}

//export goepNcclGroup
func goepNcclGroup(tid C.uint64_t, start C.int) C.int {
	if start != 0 {
		core.GroupStart(uint64(tid))
		return 0
	}
	return result(core.GroupEnd(uint64(tid)))
}

//export goepNcclMemAlloc
func goepNcclMemAlloc(out *C.uintptr_t, size C.size_t) C.int {
	p, err := core.MemAlloc(uint64(size))
	if err != nil {
		return result(err)
	}
	*out = C.uintptr_t(p)
	return 0
}

//export goepNcclMemFree
func goepNcclMemFree(p C.uintptr_t) C.int { return result(core.MemFree(uintptr(p))) }

//export goepNcclRegister
func goepNcclRegister(id C.uint64_t, p C.uintptr_t, size C.size_t, out *C.uint64_t) C.int {
	c := getComm(id)
	if c == nil {
		return result(noComm)
	}
	h, err := c.Register(uintptr(p), uint64(size))
	if err != nil {
		return result(err)
	}
	*out = C.uint64_t(h)
	return 0
}

//export goepNcclDeregister
func goepNcclDeregister(id, h C.uint64_t) C.int {
	c := getComm(id)
	if c == nil {
		return result(noComm)
	}
	return result(c.Deregister(uint64(h)))
}

//export goepNcclCounts
func goepNcclCounts(id C.uint64_t, out *C.int64_t, n C.int) C.int {
	c := getComm(id)
	if c == nil {
		return result(noComm)
	}
	dst := unsafe.Slice(out, int(n))
	i := 0
	for _, row := range c.Counts() {
		for _, v := range row {
			if i < len(dst) {
				dst[i] = C.int64_t(v)
			}
			i++
		}
	}
	return 0
}

// goepNcclPrintCounts prints every live communicator's per-path counts to
// stderr (what GOEP_NCCL_DEBUG=1 prints at finalize), for tools that want
// them earlier (scripts/torch_shim_check.py calls it through ctypes).
//
//export goepNcclPrintCounts
func goepNcclPrintCounts() {
	comms.Lock()
	live := make([]*core.Comm, 0, len(comms.m))
	ids := make([]uint64, 0, len(comms.m))
	for id := range comms.m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		live = append(live, comms.m[id])
	}
	comms.Unlock()
	for _, c := range live {
		core.Logf("%s", c.CountsString())
	}
}
