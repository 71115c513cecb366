package gpu

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goep-dev/goep/collectives/plan"
)

// The header's static_asserts state the sizes and offsets encode writes.
func TestHeaderMatchesEncoding(t *testing.T) {
	src, err := os.ReadFile("../../../kernels/plan_abi.cuh")
	require.NoError(t, err)
	sizes := map[string]int{}
	for _, m := range regexp.MustCompile(`static_assert\(sizeof\((\w+)\)\s*==\s*([\d *]+),`).FindAllStringSubmatch(string(src), -1) {
		n := 1
		for _, f := range strings.Split(m[2], "*") {
			v, err := strconv.Atoi(strings.TrimSpace(f))
			require.NoError(t, err)
			n *= v
		}
		sizes[m[1]] = n
	}
	assert.Equal(t, map[string]int{"goep_plan_operand": operandSize, "goep_plan_instr": instrSize,
		"goep_plan_block": blockSize, "goep_plan_ctx": ctxSize}, sizes)
	offsets := map[string]int{}
	for _, m := range regexp.MustCompile(`static_assert\(GOEP_OFFSETOF\((\w+),\s*(\w+)\)\s*==\s*(\d+)`).FindAllStringSubmatch(string(src), -1) {
		offsets[m[1]+"."+m[2]], _ = strconv.Atoi(m[3])
	}
	assert.Equal(t, map[string]int{"goep_plan_instr.unit": 16, "goep_plan_instr.channels": 32, "goep_plan_instr.src": 64}, offsets)
	for _, def := range []string{"GOEP_PLAN_MAX_OPERANDS " + strconv.Itoa(plan.MaxOperands),
		"GOEP_PLAN_MAX_OP_CHANNELS " + strconv.Itoa(plan.MaxChannelsPerOp),
		"GOEP_PLAN_MAX_SEMS " + strconv.Itoa(plan.MaxSemaphores),
		"GOEP_PLAN_TABLE " + strconv.Itoa(plan.MaxChannelsPerBlock),
		"GOEP_PLAN_MAX_BARRIERS " + strconv.Itoa(plan.MaxBarriers)} {
		assert.Contains(t, string(src), "#define "+def)
	}
	// Opcodes: the header's enum lists plan.Opcode's names in order.
	enum := regexp.MustCompile(`GOEP_PLAN_([A-Z0-9_]+)(?: = 0)?,`).FindAllStringSubmatch(src2enum(string(src)), -1)
	require.GreaterOrEqual(t, len(enum), int(plan.OpPipeline)+1)
	for op := plan.OpNop; op <= plan.OpPipeline; op++ {
		assert.Equal(t, strings.ToUpper(strings.ReplaceAll(op.String(), "_", "")), strings.ReplaceAll(enum[op][1], "_", ""), "opcode %d", op)
	}
}

// src2enum is the text of the opcode enum.
func src2enum(s string) string {
	i := strings.Index(s, "enum goep_plan_opcode")
	j := strings.Index(s[i:], "};")
	return s[i : i+j]
}

// Every shipped plan encodes for every rank: counts within the limits,
// pipeline bodies behind their loop, fields where the kernel reads them.
func TestEncodeShippedPlans(t *testing.T) {
	ents, err := os.ReadDir("../testdata/plans")
	require.NoError(t, err)
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		p, err := plan.Load(filepath.Join("../testdata/plans", e.Name()))
		require.NoError(t, err)
		for r := range p.GPUs {
			res, err := plan.Resolve(p, r, 1<<20, p.InPlace)
			require.NoError(t, err, "%s rank %d", p.Name, r)
			pr, err := encode(res)
			require.NoError(t, err, "%s rank %d", p.Name, r)
			require.Len(t, pr.blocks, blockSize*len(res.Blocks))
			next := 0
			for bi, b := range res.Blocks {
				blk := pr.blocks[bi*blockSize:]
				first, count := int(binary.LittleEndian.Uint32(blk)), int(binary.LittleEndian.Uint32(blk[4:]))
				assert.Equal(t, next, first)
				assert.LessOrEqual(t, count, plan.MaxOpsPerBlock)
				next += count
				at := first
				for _, in := range b.Instrs {
					ib := pr.instrs[at*instrSize:]
					assert.Equal(t, byte(in.Code), ib[0])
					assert.Equal(t, len(in.Body), int(binary.LittleEndian.Uint16(ib[10:])))
					if in.NSrc > 0 {
						assert.Equal(t, in.Src[0].Offset, binary.LittleEndian.Uint64(ib[64:]))
						assert.Equal(t, in.Src[0].Valid, binary.LittleEndian.Uint64(ib[64+16:]))
					}
					if in.NDst > 0 {
						o := ib[64+operandSize*plan.MaxOperands:]
						assert.Equal(t, in.Dst[0].Size, binary.LittleEndian.Uint64(o[8:]))
						assert.Equal(t, byte(in.Dst[0].Kind), o[24])
					}
					at += 1 + len(in.Body)
				}
				assert.Equal(t, first+count, at)
				for i, c := range b.MemoryChannels {
					assert.Equal(t, uint16(c), binary.LittleEndian.Uint16(blk[8+2*i:]))
				}
			}
			assert.Len(t, pr.instrs, next*instrSize)
		}
	}
}

// Channels must pair up (the k-th A->B with a k-th B->A) or setup would
// wait forever: checkPairs refuses the plan instead.
func TestCheckPairs(t *testing.T) {
	res := func(rank int, mem ...int) *plan.Resolved {
		r := &plan.Resolved{Rank: rank}
		for i, p := range mem {
			r.MemoryChannels = append(r.MemoryChannels, plan.Channel{Peer: p, Tag: i})
		}
		return r
	}
	assert.NoError(t, checkPairs([]*plan.Resolved{res(0, 1, 1), res(1, 0, 0)}))
	err := checkPairs([]*plan.Resolved{res(0, 1, 1), res(1, 0)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gpu 0 has 2 memory channels to gpu 1, which has 1 back")
	err = checkPairs([]*plan.Resolved{res(0, 0), res(1)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "memory channel to rank 0")
	r := res(0)
	r.PortChannels = []plan.Channel{{Peer: 3}}
	assert.ErrorContains(t, checkPairs([]*plan.Resolved{r, res(1)}), "port channel to rank 3")
}

// Every shipped plan's channels pair up on its world.
func TestShippedPlansPair(t *testing.T) {
	ents, err := os.ReadDir("../testdata/plans")
	require.NoError(t, err)
	for _, e := range ents {
		p, err := plan.Load(filepath.Join("../testdata/plans", e.Name()))
		require.NoError(t, err)
		all := make([]*plan.Resolved, p.World())
		for r := range all {
			all[r], err = plan.Resolve(p, r, 1<<20, p.InPlace)
			require.NoError(t, err)
		}
		assert.NoError(t, checkPairs(all), p.Name)
	}
}

func TestPacketBytes(t *testing.T) {
	assert.Equal(t, uint64(16), packetBytes(plan.LL16))
	assert.Equal(t, uint64(8), packetBytes(plan.LL8))
}
