package devapi

import (
	"encoding/binary"
	"fmt"
)

// Struct sizes, as channel_abi.cuh static_asserts them.
const (
	TimeoutRecordSize = 48
	WatchdogSize      = 32
	SemaphoreSize     = 48
	LL16Size          = 16
	LL8Size           = 8
	LLFlagSize        = 8
	MemoryChannelSize = 128
	FifoSize          = 64
	PortChannelSize   = 128
	TriggerSize       = 16
)

// goep_timeout_record field offsets.
const (
	RecordState     = 0
	RecordOp        = 4
	RecordID        = 8
	RecordPeer      = 12
	RecordStage     = 16
	RecordWaitedNS  = 24
	RecordExpected  = 32
	RecordObserved  = 40
	recordFieldsEnd = 48
)

// goep_watchdog field offsets.
const (
	WatchdogTimeoutNS = 0
	WatchdogRecord    = 8
	WatchdogAbort     = 16
)

// goep_semaphore field offsets.
const (
	SemInbound  = 0
	SemExpected = 8
	SemRemote   = 16
	SemWatchdog = 24
	SemPeer     = 32
	SemID       = 36
)

// goep_ll16, goep_ll8 and goep_ll_flag field offsets.
const (
	LL16Data1     = 0
	LL16Flag1     = 4
	LL16Data2     = 8
	LL16Flag2     = 12
	LL8Data       = 0
	LL8Flag       = 4
	LLFlagValue   = 0
	LLFlagArrived = 4
)

// goep_memory_channel field offsets.
const (
	MCSem               = 0
	MCRemote            = 48
	MCLocal             = 56
	MCRemotePackets     = 64
	MCLocalPackets      = 72
	MCFlag              = 80
	MCRemoteSize        = 88
	MCLocalSize         = 96
	MCRemotePacketsSize = 104
	MCLocalPacketsSize  = 112
)

// goep_fifo field offsets.
const (
	FifoTriggers  = 0
	FifoHead      = 8
	FifoTail      = 16
	FifoTailCache = 24
	FifoDone      = 32
	FifoWatchdog  = 40
	FifoSlots     = 48
)

// goep_port_channel field offsets.
const (
	PCFifo    = 0
	PCSem     = 64
	PCChannel = 112
	PCDst     = 116
	PCSrc     = 120
)

// Timeout record states (goep_timeout_record.state).
const (
	TimeoutNone    = 0
	TimeoutExpired = 1
)

// What a spin waited for (goep_timeout_record.op).
const (
	OpSemWait        = 1
	OpSemRelaxedWait = 2
	OpSemPoll        = 3
	OpPacket         = 4
	OpValue          = 5
	OpFifoPush       = 6
	OpFlush          = 7
)

// OpName says what op waited for, for error messages.
func OpName(op uint32) string {
	switch op {
	case OpSemWait:
		return "semaphore wait"
	case OpSemRelaxedWait:
		return "relaxed semaphore wait"
	case OpSemPoll:
		return "semaphore poll"
	case OpPacket:
		return "LL packet read"
	case OpValue:
		return "counter wait"
	case OpFifoPush:
		return "FIFO push (ring full, the proxy made no room)"
	case OpFlush:
		return "port channel flush"
	}
	return fmt.Sprintf("wait of unknown kind %d", op)
}

// Watchdog abort values (goep_watchdog.abort).
const (
	AbortNone    = 0
	AbortTimeout = 1
	AbortHost    = 2
)

var le = binary.LittleEndian

// Semaphore is goep_semaphore.
type Semaphore struct {
	Inbound, Expected, Remote, Watchdog uintptr
	Peer, ID                            uint32
}

// Encode writes s into b[:SemaphoreSize] (reserved bytes zero).
func (s Semaphore) Encode(b []byte) {
	clear(b[:SemaphoreSize])
	le.PutUint64(b[SemInbound:], uint64(s.Inbound))
	le.PutUint64(b[SemExpected:], uint64(s.Expected))
	le.PutUint64(b[SemRemote:], uint64(s.Remote))
	le.PutUint64(b[SemWatchdog:], uint64(s.Watchdog))
	le.PutUint32(b[SemPeer:], s.Peer)
	le.PutUint32(b[SemID:], s.ID)
}

// Bytes is s encoded.
func (s Semaphore) Bytes() []byte {
	b := make([]byte, SemaphoreSize)
	s.Encode(b)
	return b
}

// DecodeSemaphore reads a goep_semaphore from b.
func DecodeSemaphore(b []byte) Semaphore {
	_ = b[SemaphoreSize-1]
	return Semaphore{
		Inbound:  uintptr(le.Uint64(b[SemInbound:])),
		Expected: uintptr(le.Uint64(b[SemExpected:])),
		Remote:   uintptr(le.Uint64(b[SemRemote:])),
		Watchdog: uintptr(le.Uint64(b[SemWatchdog:])),
		Peer:     le.Uint32(b[SemPeer:]),
		ID:       le.Uint32(b[SemID:]),
	}
}

// MemoryChannel is goep_memory_channel.
type MemoryChannel struct {
	Sem                                        Semaphore
	Remote, Local, RemotePackets, LocalPackets uintptr
	Flag                                       uintptr
	RemoteSize, LocalSize                      uint64
	RemotePacketsSize, LocalPacketsSize        uint64
}

// Encode writes c into b[:MemoryChannelSize] (reserved bytes zero).
func (c MemoryChannel) Encode(b []byte) {
	clear(b[:MemoryChannelSize])
	c.Sem.Encode(b[MCSem:])
	le.PutUint64(b[MCRemote:], uint64(c.Remote))
	le.PutUint64(b[MCLocal:], uint64(c.Local))
	le.PutUint64(b[MCRemotePackets:], uint64(c.RemotePackets))
	le.PutUint64(b[MCLocalPackets:], uint64(c.LocalPackets))
	le.PutUint64(b[MCFlag:], uint64(c.Flag))
	le.PutUint64(b[MCRemoteSize:], c.RemoteSize)
	le.PutUint64(b[MCLocalSize:], c.LocalSize)
	le.PutUint64(b[MCRemotePacketsSize:], c.RemotePacketsSize)
	le.PutUint64(b[MCLocalPacketsSize:], c.LocalPacketsSize)
}

// Bytes is c encoded.
func (c MemoryChannel) Bytes() []byte {
	b := make([]byte, MemoryChannelSize)
	c.Encode(b)
	return b
}

// DecodeMemoryChannel reads a goep_memory_channel from b.
func DecodeMemoryChannel(b []byte) MemoryChannel {
	_ = b[MemoryChannelSize-1]
	return MemoryChannel{
		Sem:               DecodeSemaphore(b[MCSem:]),
		Remote:            uintptr(le.Uint64(b[MCRemote:])),
		Local:             uintptr(le.Uint64(b[MCLocal:])),
		RemotePackets:     uintptr(le.Uint64(b[MCRemotePackets:])),
		LocalPackets:      uintptr(le.Uint64(b[MCLocalPackets:])),
		Flag:              uintptr(le.Uint64(b[MCFlag:])),
		RemoteSize:        le.Uint64(b[MCRemoteSize:]),
		LocalSize:         le.Uint64(b[MCLocalSize:]),
		RemotePacketsSize: le.Uint64(b[MCRemotePacketsSize:]),
		LocalPacketsSize:  le.Uint64(b[MCLocalPacketsSize:]),
	}
}

// Watchdog is goep_watchdog.
type Watchdog struct {
	TimeoutNS uint64
	Record    uintptr
	Abort     uint32
}

// Encode writes w into b[:WatchdogSize] (reserved bytes zero).
func (w Watchdog) Encode(b []byte) {
	clear(b[:WatchdogSize])
	le.PutUint64(b[WatchdogTimeoutNS:], w.TimeoutNS)
	le.PutUint64(b[WatchdogRecord:], uint64(w.Record))
	le.PutUint32(b[WatchdogAbort:], w.Abort)
}

// TimeoutRecord is goep_timeout_record.
type TimeoutRecord struct {
	State, Op, ID, Peer, Stage   uint32
	WaitedNS, Expected, Observed uint64
}

// DecodeTimeoutRecord reads a goep_timeout_record from b.
func DecodeTimeoutRecord(b []byte) TimeoutRecord {
	_ = b[recordFieldsEnd-1]
	return TimeoutRecord{
		State:    le.Uint32(b[RecordState:]),
		Op:       le.Uint32(b[RecordOp:]),
		ID:       le.Uint32(b[RecordID:]),
		Peer:     le.Uint32(b[RecordPeer:]),
		Stage:    le.Uint32(b[RecordStage:]),
		WaitedNS: le.Uint64(b[RecordWaitedNS:]),
		Expected: le.Uint64(b[RecordExpected:]),
		Observed: le.Uint64(b[RecordObserved:]),
	}
}

// Field is one member of a struct of the device ABI.
type Field struct {
	Name   string
	Offset int
}

// Struct is one struct of the device ABI with its size and members.
type Struct struct {
	Name   string // the C name in channel_abi.cuh
	Size   int
	Fields []Field
}

// Layout lists every struct of the device ABI, for tests that hold the Go
// and C sides to each other.
var Layout = []Struct{
	{"goep_timeout_record", TimeoutRecordSize, []Field{
		{"state", RecordState}, {"op", RecordOp}, {"id", RecordID}, {"peer", RecordPeer}, {"stage", RecordStage},
		{"waited_ns", RecordWaitedNS}, {"expected", RecordExpected}, {"observed", RecordObserved}}},
	{"goep_watchdog", WatchdogSize, []Field{
		{"timeout_ns", WatchdogTimeoutNS}, {"record", WatchdogRecord}, {"abort", WatchdogAbort}}},
	{"goep_semaphore", SemaphoreSize, []Field{
		{"inbound", SemInbound}, {"expected", SemExpected}, {"remote", SemRemote}, {"wd", SemWatchdog},
		{"peer", SemPeer}, {"id", SemID}}},
	{"goep_ll16", LL16Size, []Field{
		{"flag1", LL16Flag1}, {"data2", LL16Data2}, {"flag2", LL16Flag2}}},
	{"goep_ll8", LL8Size, []Field{{"flag", LL8Flag}}},
	{"goep_ll_flag", LLFlagSize, []Field{{"arrived", LLFlagArrived}}},
	{"goep_memory_channel", MemoryChannelSize, []Field{
		{"sem", MCSem}, {"remote", MCRemote}, {"local", MCLocal}, {"remote_packets", MCRemotePackets},
		{"local_packets", MCLocalPackets}, {"flag", MCFlag}, {"remote_size", MCRemoteSize},
		{"local_size", MCLocalSize}, {"remote_packets_size", MCRemotePacketsSize},
		{"local_packets_size", MCLocalPacketsSize}}},
	{"goep_fifo", FifoSize, []Field{
		{"triggers", FifoTriggers}, {"head", FifoHead}, {"tail", FifoTail}, {"tail_cache", FifoTailCache},
		{"done", FifoDone}, {"wd", FifoWatchdog}, {"size", FifoSlots}}},
	{"goep_port_channel", PortChannelSize, []Field{
		{"fifo", PCFifo}, {"sem", PCSem}, {"channel", PCChannel}, {"dst", PCDst}, {"src", PCSrc}}},
}
