package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/goep-dev/goep/routing"
)

func init() {
	register("route", "read a routing (topk_idx .npy: --file, or --generate one) and print per-rank/per-expert load, imbalance and rank-to-rank traffic", runRoute)
}

// routeReport is the JSON form of ep-bench route's output.
type routeReport struct {
	File   string `json:"file"`
	Dtype  string `json:"dtype"`
	Hidden int    `json:"hidden"`
	// BytesPerToken is hidden * 2: one BF16 token row.
	BytesPerToken int64 `json:"bytes_per_token_bf16"`
	*Traffic
	MatrixBytes [][]int64 `json:"matrix_bytes_bf16"`
	// RecvBytes and SendBytes per rank count every copy, the rank's own
	// tokens to itself included (DeepEP's accounting); RemoteSendBytes
	// leaves those out: what crosses NVLink.
	RecvBytes       []int64 `json:"recv_bytes_bf16"`
	SendBytes       []int64 `json:"send_bytes_bf16"`
	RemoteSendBytes []int64 `json:"remote_send_bytes_bf16"`
}

func runRoute(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("route", stderr)
	file := fs.String("file", "", "the routing to read: topk_idx as a .npy file, (tokens, topk) int64 or int32, C order")
	generate := fs.String("generate", "", "write a routing to this .npy file first (DeepEP's generator: top-k of |randn|+1 scores, "+
		"--tokens per rank, every rank's in rank order), then read it")
	tokens := fs.Int("tokens", 4096, "with --generate: tokens per rank")
	topk := new(int)
	*topk = 8
	fs.Func("topk", "with --generate: experts per token (default 8; a file's top-k is its second dimension)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("want a number of experts per token, for --generate; the routing file to read is --file")
		}
		*topk = n
		return nil
	})
	seed := fs.Uint64("seed", 1, "with --generate: the seed (rank r's routing is intranode's at the same seed)")
	masked := fs.Int("masked", 0, "with --generate: random (token, slot) entries per rank set to -1")
	experts := fs.Int("experts", 0, "number of experts (required)")
	ranks := fs.Int("ranks", 0, "number of ranks the experts are spread over (required)")
	hidden := fs.Int("hidden", 7168, "hidden size, for BF16 bytes = tokens * hidden * 2")
	source := fs.String("source-rank-of", "block",
		"which rank holds each token: block (the file is every rank's tokens concatenated in rank order: rank r holds "+
			"tokens [r*ceil(T/R), (r+1)*ceil(T/R))), cyclic (token t on rank t%R), or rank:N (the file is rank N's own routing)")
	jsonPath := fs.String("json", "", "also write the report as JSON to this file ('-': stdout, instead of the tables)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ep-bench route --file topk.npy --experts E --ranks R [flags]")
		fmt.Fprintln(stderr, "       ep-bench route --generate topk.npy --experts E --ranks R [--tokens T --topk K] [flags]")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	set := given(fs)
	switch {
	case *file == "" && *generate == "":
		if set["topk"] {
			return errors.New("route reads the routing from --file (its top-k is the file's second dimension); --topk is for --generate")
		}
		fs.Usage()
		return errors.New("want --file FILE.npy (a routing to read) or --generate FILE.npy (one to write, then read)")
	case *file != "" && *generate != "":
		return errors.New("--file and --generate exclude each other (--generate reads the file it writes)")
	case *file != "" && (set["tokens"] || set["topk"] || set["seed"] || set["masked"]):
		return errors.New("--tokens, --topk, --seed and --masked describe what --generate writes; a --file brings its own")
	}
	if *experts <= 0 || *ranks <= 0 {
		return fmt.Errorf("--experts and --ranks are required and must be at least 1 (have %d and %d)", *experts, *ranks)
	}
	if err := checkRange("hidden", *hidden, 0, maxHidden); err != nil {
		return err
	}
	place, err := ParsePlacement(*source)
	if err != nil {
		return fmt.Errorf("--source-rank-of: %w", err)
	}
	if err := checkOutputs("json", *jsonPath, "generate", *generate); err != nil {
		return err
	}
	if *generate != "" {
		shape := routing.Shape{Tokens: *tokens, K: *topk, Experts: *experts, Ranks: *ranks}
		if err := shape.Validate(); err != nil {
			return err
		}
		if err := checkMasked(*masked, *topk, []int{*tokens}); err != nil {
			return err
		}
		if err := generateRouting(ctx, *generate, shape, *seed, *masked); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "route: wrote %s: %d ranks x %d tokens, top-%d of %d experts (seed %d)\n", *generate, *ranks, *tokens, *topk, *experts, *seed)
		*file = *generate
	}
	n, err := LoadNPY(*file)
	if err != nil {
		return err
	}
	r, err := n.Routing(*experts, *ranks)
	if err != nil {
		return fmt.Errorf("%s: %w", *file, err)
	}
	tr, err := Analyze(r, place)
	if err != nil {
		return err
	}
	rep := newRouteReport(*file, n.Int32, *hidden, tr)
	if *jsonPath == "-" {
		return writeJSONTo(stdout, rep)
	}
	printRoute(stdout, rep)
	return writeJSON(*jsonPath, rep)
}

// generateRouting writes every rank's routing (intranode's generator and
// seeds, so `ep-bench intranode` at the same shape and seed routes the
// same way) as one (ranks*tokens, k) int64 .npy, rank 0's tokens first.
func generateRouting(ctx context.Context, path string, s routing.Shape, seed uint64, masked int) error {
	all := make([]int64, 0, s.Ranks*s.Tokens*s.K)
	for r := range s.Ranks {
		if err := interrupted(ctx); err != nil {
			return err
		}
		rt, err := routing.Generate(s, routing.GenOptions{Seed: rankSeed(seed, r), Masked: masked})
		if err != nil {
			return err
		}
		all = append(all, rt.Idx...)
	}
	var b bytes.Buffer
	if err := WriteNPY(&b, all, s.Ranks*s.Tokens, s.K, false); err != nil {
		return err
	}
	return os.WriteFile(path, b.Bytes(), 0o644)
}

func newRouteReport(file string, as32 bool, hidden int, tr *Traffic) *routeReport {
	rep := &routeReport{File: file, Dtype: "<i8", Hidden: hidden, BytesPerToken: int64(hidden) * 2, Traffic: tr}
	if as32 {
		rep.Dtype = "<i4"
	}
	R := tr.Ranks
	rep.MatrixBytes = make([][]int64, R)
	rep.RecvBytes, rep.SendBytes, rep.RemoteSendBytes = make([]int64, R), make([]int64, R), make([]int64, R)
	for s := 0; s < R; s++ {
		rep.MatrixBytes[s] = make([]int64, R)
		for d := 0; d < R; d++ {
			b := tr.Matrix[s][d] * rep.BytesPerToken
			rep.MatrixBytes[s][d] = b
			rep.SendBytes[s] += b
			rep.RecvBytes[d] += b
			if s != d {
				rep.RemoteSendBytes[s] += b
			}
		}
	}
	return rep
}

func printRoute(w io.Writer, rep *routeReport) {
	tr := rep.Traffic
	fmt.Fprintf(w, "routing %s: T=%d K=%d (%s), E=%d over R=%d ranks (%d experts each), %d entries masked (-1)\n",
		rep.File, tr.Tokens, tr.K, rep.Dtype, tr.Experts, tr.Ranks, tr.ExpertsPerRank(), tr.Masked)
	fmt.Fprintf(w, "tokens placed by %s; a token goes to a rank once however many of its experts live there; bytes are BF16 rows of hidden %d (%d bytes per token)\n\n",
		tr.Placement, rep.Hidden, rep.BytesPerToken)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rank\tholds\treceives\texpert slots\tsends (remote)\trecv MiB\tsend MiB (remote)\t")
	for r := 0; r < tr.Ranks; r++ {
		remote := sum(tr.Matrix[r]) - tr.Matrix[r][r]
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d (%d)\t%.2f\t%.2f (%.2f)\t\n", r, tr.SourceTokens[r], tr.RecvTokens[r], tr.RankEntries[r],
			sum(tr.Matrix[r]), remote, mib(rep.RecvBytes[r]), mib(rep.SendBytes[r]), mib(rep.RemoteSendBytes[r]))
	}
	tw.Flush()
	fmt.Fprintf(w, "imbalance (max/mean): rank tokens received %.3f, rank expert slots %.3f, expert tokens %.3f\n\n",
		tr.RankImbalance, tr.RankEntryImbalance, tr.ExpertImbalance)

	fmt.Fprintf(w, "tokens per expert (row label = first expert of the row; experts of rank r are %d*r .. %d*r+%d):\n",
		tr.ExpertsPerRank(), tr.ExpertsPerRank(), tr.ExpertsPerRank()-1)
	const perLine = 16
	for e := 0; e < tr.Experts; e += perLine {
		var b strings.Builder
		fmt.Fprintf(&b, "%5d:", e)
		for _, n := range tr.ExpertTokens[e:min(e+perLine, tr.Experts)] {
			fmt.Fprintf(&b, " %6d", n)
		}
		fmt.Fprintln(w, b.String())
	}

	fmt.Fprintln(w, "\ntraffic in tokens (row = source rank, column = destination rank, diagonal = kept on the rank):")
	printMatrix(w, tr.Matrix, func(v int64) string { return fmt.Sprint(v) })
	fmt.Fprintln(w, "\ntraffic in MiB of BF16:")
	printMatrix(w, rep.MatrixBytes, func(v int64) string { return fmt.Sprintf("%.2f", mib(v)) })
}

func printMatrix(w io.Writer, m [][]int64, cell func(int64) string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "src\\dst\t")
	for d := range m {
		fmt.Fprintf(tw, "%d\t", d)
	}
	fmt.Fprintln(tw)
	for s, row := range m {
		fmt.Fprintf(tw, "%d\t", s)
		for _, v := range row {
			fmt.Fprintf(tw, "%s\t", cell(v))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func sum(v []int64) int64 {
	var s int64
	for _, x := range v {
		s += x
	}
	return s
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// writeJSONTo writes v as indented JSON to w, as writeJSON does to a file.
func writeJSONTo(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}
