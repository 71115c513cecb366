package plan

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"unicode/utf8"
)

// The structs below mirror the MSCCL++ execution-plan JSON field for field
// (see /work/shared/reference/plan-format.md; the DSL's to_json writes it).
//
// Optional keys are omitempty, so that a plan written with
// encoding/json (the DSL in plan/dsl does) has only the keys its ops use,
// as MSCCL++'s parser expects (it tests for their presence).
//
// Decoding policy: wrong JSON types are errors (encoding/json reports the
// field path); unknown fields are tolerated, because the DSL adds optional
// keys between releases and a plan that runs is better than a plan refused
// for a comment-like key. Every field this package relies on is checked by
// Validate, which runs as part of Parse.

// Plan is one execution plan file.
type Plan struct {
	Name       string `json:"name"`
	Collective string `json:"collective"`
	Protocol   string `json:"protocol"` // "Simple" or "LL"
	InPlace    bool   `json:"inplace"`
	// ReuseResources: scratch is a fixed 64 MiB slice and scratch offsets
	// wrap modulo the scratch chunk size (pipelined plans).
	ReuseResources         bool   `json:"reuse_resources"`
	UseDoubleScratchBuffer bool   `json:"use_double_scratch_buffer"`
	BufferAlignment        uint64 `json:"buffer_alignment"`      // default 16
	NumThreadsPerBlock     int    `json:"num_threads_per_block"` // default 1024
	MinMessageSize         uint64 `json:"min_message_size"`      // default 0
	MaxMessageSize         uint64 `json:"max_message_size"`      // default 2^64-1
	GPUs                   []GPU  `json:"gpus"`

	// Source is where the plan came from (a file name, or "" when parsed
	// from bytes); errors name it. Not part of the JSON.
	Source string `json:"-"`
}

// GPU is one rank's part of a plan (gpus[rank]; ID must equal the rank).
type GPU struct {
	ID            int             `json:"id"`
	InputChunks   int             `json:"input_chunks"`
	OutputChunks  int             `json:"output_chunks"`
	ScratchChunks int             `json:"scratch_chunks"`
	Threadblocks  []Threadblock   `json:"threadblocks"`
	Channels      []GPUChannel    `json:"channels"`
	RemoteBuffers []RemoteBuffer  `json:"remote_buffers"`
	Semaphores    []SemaphoreInit `json:"semaphores"`
}

// GPUChannel is one entry of a GPU's channel list: memory or port channels
// (one per ConnectedTo entry, indexed by position in the concatenation of
// all entries of that type), or one switch (NVLS) channel.
type GPUChannel struct {
	ChannelType string      `json:"channel_type"` // memory, port, switch
	ConnectedTo []int       `json:"connected_to,omitempty"`
	BufferType  string      `json:"buffer_type,omitempty"` // switch: i, o or s
	RankGroups  []RankGroup `json:"rank_groups,omitempty"` // switch
}

// RankGroup is a switch channel's group of ranks.
type RankGroup struct {
	Size  int   `json:"size"`
	Ranks []int `json:"ranks"`
}

// RemoteBuffer is a buffer of another rank this GPU accesses; the owner
// registers it and sends it over.
type RemoteBuffer struct {
	Rank               int      `json:"rank"`
	Type               string   `json:"type"` // i, o, s
	AccessChannelTypes []string `json:"access_channel_types"`
}

// SemaphoreInit is an intra-GPU, inter-block counting semaphore.
type SemaphoreInit struct {
	InitValue int64 `json:"init_value"`
}

// Threadblock is one CUDA block's program.
type Threadblock struct {
	ID               int            `json:"id"`
	Ops              []Op           `json:"ops"`
	Channels         []TBChannels   `json:"channels"`
	RemoteBufferRefs []RemoteBufRef `json:"remote_buffer_refs"`
}

// TBChannels lists, for one channel type, the GPU channel indices the block
// uses; an op's channel_ids index this list.
type TBChannels struct {
	ChannelType string `json:"channel_type"`
	ChannelIDs  []int  `json:"channel_ids"`
}

// RemoteBufRef lists, for one access channel type, the GPU remote-buffer
// indices the block uses; a remote buffer ref's buffer_id indexes it.
type RemoteBufRef struct {
	AccessChannelType string `json:"access_channel_type"`
	RemoteBufferIDs   []int  `json:"remote_buffer_ids"`
}

// Op is one operation. Which fields matter depends on Name (see ops.go).
type Op struct {
	Name         string       `json:"name"`
	ChannelType  string       `json:"channel_type,omitempty"`
	ChannelIDs   []int        `json:"channel_ids,omitempty"`
	Src          []BufRef     `json:"src_buff,omitempty"`
	Dst          []BufRef     `json:"dst_buff,omitempty"`
	ReduceOp     string       `json:"reduce_op,omitempty"`
	TBGInfo      *TBGInfo     `json:"tbg_info,omitempty"`
	BarrierID    *int         `json:"barrier_id,omitempty"`
	NumTBs       *int         `json:"num_threadblocks,omitempty"`
	SemaphoreIDs []int        `json:"semaphore_ids,omitempty"`
	IterContext  *IterContext `json:"iter_context,omitempty"`
	Ops          []Op         `json:"ops,omitempty"` // pipeline body
}

// BufRef is a buffer operand: local {type, index, size}, remote
// {buffer_id, index, size} or switch {switch_channel_id, index, size}.
// Index and size are in chunks.
type BufRef struct {
	Type            string `json:"type,omitempty"`
	BufferID        *int   `json:"buffer_id,omitempty"`
	SwitchChannelID *int   `json:"switch_channel_id,omitempty"`
	Index           int    `json:"index"`
	Size            int    `json:"size"`
}

// TBGInfo splits every operand's byte range across a group of blocks.
type TBGInfo struct {
	TBID    int `json:"tb_id"`
	TBGSize int `json:"tbg_size"`
}

// IterContext drives a pipeline op.
type IterContext struct {
	UnitSize  uint64 `json:"unit_size"`
	NumChunks int    `json:"num_chunks"`
}

// MaxPlanBytes bounds what Parse reads (the largest DSL plans are a few MB).
const MaxPlanBytes = 64 << 20

// Load reads and validates a plan file.
func Load(path string) (*Plan, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxPlanBytes+1))
	if err != nil {
		return nil, fmt.Errorf("plan %s: %w", path, err)
	}
	return parse(b, path)
}

// Parse decodes and validates a plan from JSON bytes.
func Parse(data []byte) (*Plan, error) { return parse(data, "") }

func parse(data []byte, source string) (*Plan, error) {
	where := "plan"
	if source != "" {
		where = "plan " + source
	}
	if len(data) > MaxPlanBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", where, MaxPlanBytes)
	}
	// Required top-level keys: upstream indexes them without defaults.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return nil, fmt.Errorf("%s: %w", where, describeJSONError(data, err))
	}
	for _, k := range []string{"name", "collective", "protocol", "inplace", "gpus"} {
		if _, ok := keys[k]; !ok {
			return nil, fmt.Errorf("%s: field %q is missing", where, k)
		}
	}
	// Defaults first: json leaves absent fields alone.
	p := &Plan{BufferAlignment: 16, NumThreadsPerBlock: 1024, MaxMessageSize: math.MaxUint64, Source: source}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(p); err != nil {
		return nil, fmt.Errorf("%s: %w", where, describeJSONError(data, err))
	}
	if dec.More() {
		return nil, fmt.Errorf("%s: trailing data after the JSON object", where)
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}

// describeJSONError adds the line of a syntax error, and the field path
// and expected type of a type error.
func describeJSONError(data []byte, err error) error {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		if se.Offset >= int64(len(bytes.TrimRight(data, " \t\r\n"))) {
			return fmt.Errorf("truncated JSON (it ends at line %d): %w", lineOf(data, se.Offset), err)
		}
		return fmt.Errorf("invalid JSON at line %d: %w", lineOf(data, se.Offset), err)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		where := "the plan"
		if te.Field != "" {
			where = fmt.Sprintf("field %q", clip(te.Field))
		}
		return fmt.Errorf("%s at line %d: JSON %s where %s is expected", where, lineOf(data, te.Offset), te.Value, jsonKind(te.Type))
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return fmt.Errorf("truncated JSON: %w", err)
	}
	return err
}

// jsonKind names what JSON a Go type is decoded from, so that errors speak
// of the file's format rather than of our types.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	switch t.Kind() {
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a non-negative whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another value"
}

// maxEcho bounds how much of a string read from a plan an error repeats.
const maxEcho = 200

// clip shortens s, read from the input, for an error message.
func clip(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	cut := maxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s... (%d bytes in all)", s[:cut], len(s))
}

func lineOf(data []byte, off int64) int {
	if off < 0 {
		off = 0
	}
	if off > int64(len(data)) {
		off = int64(len(data))
	}
	return 1 + bytes.Count(data[:off], []byte("\n"))
}

// label names the plan in errors.
func (p *Plan) label() string {
	if p.Source != "" && p.Source != p.Name {
		return fmt.Sprintf("plan %q (%s)", clip(p.Name), clip(p.Source))
	}
	return fmt.Sprintf("plan %q", clip(p.Name))
}

// World is the number of ranks the plan is written for.
func (p *Plan) World() int {
	if p == nil {
		var r0 int
		return r0
	}
	return len(p.GPUs)
}

// IsLL reports whether the plan uses the LL (packet) protocol.
func (p *Plan) IsLL() bool {
	if p == nil {
		var r0 bool
		return r0
	}
	return p.Protocol == "LL"
}
