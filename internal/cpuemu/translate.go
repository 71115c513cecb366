package cpuemu

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// translate turns one CUDA source file into C++ for g++ and the runtime in
// runtime/emu_runtime.h. It rewrites three things and nothing else:
//
//   - each inline asm statement becomes the runtime calls its PTX means
//     (ptxRules; PTX no rule knows becomes a call that fails the launch
//     when it runs, and is listed in unknown);
//   - each `__shared__ T name[...];` becomes a reference to per-block
//     storage keyed by the declaration (a function-local static), so that
//     every thread of a block, and only of that block, sees the same bytes;
//   - each `extern __shared__ T name[];` becomes a pointer to the block's
//     dynamic shared memory.
//
// Comments and string literals are left alone; line structure is kept
// (diagnostics point at the original lines).
func translate(file, src string) (out string, unknown []string, err error) {
	var b strings.Builder
	site := 0
	i := 0
	for i < len(src) {
		j, kind := nextToken(src, i)
		b.WriteString(src[i:j])
		if j >= len(src) {
			break
		}
		switch kind {
		case tokAsm:
			end, code, unk, err := translateAsm(src, j)
			if err != nil {
				return "", nil, fmt.Errorf("%s:%d: %w", file, lineOf(src, j), err)
			}
			if unk != "" {
				unknown = append(unknown, fmt.Sprintf("%s:%d: %s", file, lineOf(src, j), unk))
			}
			// Keep the line count: the asm statement may span lines (of a
			// macro, too: continuations stay).
			b.WriteString(code)
			for k := j; k < end; k++ {
				if src[k] == '\n' {
					if k > j && src[k-1] == '\\' {
						b.WriteString(" \\")
					}
					b.WriteByte('\n')
				}
			}
			i = end
		case tokShared:
			end := strings.IndexByte(src[j:], ';')
			if end < 0 {
				return "", nil, fmt.Errorf("%s:%d: __shared__ declaration without ';'", file, lineOf(src, j))
			}
			end += j + 1
			site++
			code, err := translateShared(src[j:end], site)
			if err != nil {
				return "", nil, fmt.Errorf("%s:%d: %w", file, lineOf(src, j), err)
			}
			b.WriteString(code)
			i = end
		default: // a comment or literal, copied whole
			k := skipOpaque(src, j)
			b.WriteString(src[j:k])
			i = k
		}
	}
	return b.String(), unknown, nil
}

type tokKind int

const (
	tokOpaque tokKind = iota
	tokAsm
	tokShared
)

func isIdent(c byte) bool {
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// nextToken finds, from i, the next comment or literal (tokOpaque), asm
// statement or __shared__ declaration (including `extern __shared__`).
func nextToken(s string, i int) (int, tokKind) {
	for k := i; k < len(s); k++ {
		c := s[k]
		switch {
		case c == '/' && k+1 < len(s) && (s[k+1] == '/' || s[k+1] == '*'):
			return k, tokOpaque
		case c == '"' || c == '\'':
			return k, tokOpaque
		case c == 'a' && (k == 0 || !isIdent(s[k-1])) && strings.HasPrefix(s[k:], "asm") && k+3 < len(s) && !isIdent(s[k+3]):
			return k, tokAsm
		case c == 'e' && (k == 0 || !isIdent(s[k-1])) && strings.HasPrefix(s[k:], "extern __shared__ "):
			return k, tokShared
		case c == '_' && (k == 0 || !isIdent(s[k-1])) && strings.HasPrefix(s[k:], "__shared__ "):
			return k, tokShared
		}
	}
	return len(s), tokOpaque
}

// skipOpaque returns the end of the comment or literal at i.
func skipOpaque(s string, i int) int {
	switch {
	case strings.HasPrefix(s[i:], "//"):
		if e := strings.IndexByte(s[i:], '\n'); e >= 0 {
			return i + e
		}
		return len(s)
	case strings.HasPrefix(s[i:], "/*"):
		if e := strings.Index(s[i+2:], "*/"); e >= 0 {
			return i + 2 + e + 2
		}
		return len(s)
	}
	q := s[i]
	for k := i + 1; k < len(s); k++ {
		if s[k] == '\\' {
			k++
			continue
		}
		if s[k] == q || s[k] == '\n' {
			return k + 1
		}
	}
	return len(s)
}

func lineOf(s string, i int) int { return strings.Count(s[:i], "\n") + 1 }

var (
	sharedRE    = regexp.MustCompile(`^__shared__\s+((?:__align__\(\d+\)\s+)?(?:const\s+)?[\w:]+(?:\s*\*)*)\s*(\w+)\s*((?:\[[^\]]+\]\s*)*);$`)
	externShRE  = regexp.MustCompile(`^extern\s+__shared__\s+(?:__align__\(\d+\)\s+)?((?:const\s+)?[\w:]+)\s+(\w+)\s*\[\s*\]\s*;$`)
	alignPrefix = regexp.MustCompile(`^__align__\(\d+\)\s+`)
)

func translateShared(decl string, site int) (string, error) {
	d := strings.Join(strings.Fields(decl), " ")
	if m := externShRE.FindStringSubmatch(d); m != nil {
		return fmt.Sprintf("%s* %s = (%s*)emu_dyn_shared();", m[1], m[2], m[1]), nil
	}
	m := sharedRE.FindStringSubmatch(d)
	if m == nil {
		return "", fmt.Errorf("cpuemu cannot rewrite the __shared__ declaration %q (one variable per declaration, no initialiser)", decl)
	}
	typ := strings.TrimSpace(alignPrefix.ReplaceAllString(m[1], ""))
	name, dims := m[2], strings.ReplaceAll(m[3], " ", "")
	key := fmt.Sprintf("emu_shk_%d_%s", site, name)
	if dims == "" {
		return fmt.Sprintf("static char %s; %s& %s = emu_shared_var<%s>(&%s);", key, typ, name, typ, key), nil
	}
	return fmt.Sprintf("static char %s; %s (&%s)%s = emu_shared_var<%s%s>(&%s);", key, typ, name, dims, typ, dims, key), nil
}

// translateAsm parses the asm statement at i and returns where it ends
// (after its ';') and the C++ that replaces it.
func translateAsm(s string, i int) (end int, code, unknown string, err error) {
	k := i + 3
	skipSpace := func() {
		for k < len(s) && (s[k] == ' ' || s[k] == '\t' || s[k] == '\n' || s[k] == '\\') {
			k++
		}
	}
	skipSpace()
	for _, q := range []string{"volatile", "__volatile__"} {
		if strings.HasPrefix(s[k:], q) {
			k += len(q)
			skipSpace()
		}
	}
	if k >= len(s) || s[k] != '(' {
		return 0, "", "", fmt.Errorf("asm without '('")
	}
	// The balanced parenthesis, strings respected.
	open, depth := k, 0
	for ; k < len(s); k++ {
		switch s[k] {
		case '"':
			k = skipOpaque(s, k) - 1
		case '(':
			depth++
		case ')':
			depth--
		}
		if depth == 0 {
			break
		}
	}
	if k >= len(s) {
		return 0, "", "", fmt.Errorf("unbalanced asm statement")
	}
	body := s[open+1 : k]
	k++
	skipSpace()
	if k >= len(s) || s[k] != ';' {
		return 0, "", "", fmt.Errorf("asm statement not followed by ';'")
	}
	end = k + 1
	sections := splitTop(body, ':')
	tmpl, err := joinLiterals(sections[0])
	if err != nil {
		return 0, "", "", err
	}
	var ops []string
	for _, sec := range sections[1:min(len(sections), 3)] {
		for _, op := range splitTop(sec, ',') {
			op = strings.TrimSpace(strings.ReplaceAll(op, "\\\n", " "))
			if op == "" {
				continue
			}
			p := strings.IndexByte(op, '(')
			if p < 0 || !strings.HasSuffix(op, ")") {
				return 0, "", "", fmt.Errorf("asm operand %q: want \"constraint\"(expression)", op)
			}
			ops = append(ops, "("+op[p+1:len(op)-1]+")")
		}
	}
	ptx := strings.Join(strings.Fields(tmpl), " ")
	for _, r := range ptxRules {
		if m := r.re.FindStringSubmatch(ptx); m != nil {
			c := r.emit(m)
			c = opRE.ReplaceAllStringFunc(c, func(x string) string {
				n, _ := strconv.Atoi(x[1:])
				if n < len(ops) {
					return ops[n]
				}
				return x
			})
			if opRE.MatchString(c) {
				return 0, "", "", fmt.Errorf("PTX %q names an operand the statement does not have", ptx)
			}
			return end, "{ " + c + " }", "", nil
		}
	}
	return end, fmt.Sprintf("{ emu_unsupported_ptx(%s); }", strconv.Quote(ptx)), ptx, nil
}

var opRE = regexp.MustCompile(`\$\d+`)

// splitTop splits s at sep outside parentheses, brackets and strings.
func splitTop(s string, sep byte) []string {
	var out []string
	depth, last := 0, 0
	for k := 0; k < len(s); k++ {
		switch c := s[k]; {
		case c == '"':
			k = skipOpaque(s, k) - 1
		case c == '(' || c == '[' || c == '{':
			depth++
		case c == ')' || c == ']' || c == '}':
			depth--
		case c == sep && depth == 0:
			out = append(out, s[last:k])
			last = k + 1
		}
	}
	return append(out, s[last:])
}

// joinLiterals concatenates the adjacent string literals of an asm template.
func joinLiterals(s string) (string, error) {
	var b strings.Builder
	for k := 0; k < len(s); k++ {
		switch s[k] {
		case ' ', '\t', '\n', '\\', '\r':
		case '"':
			e := skipOpaque(s, k)
			lit, err := strconv.Unquote(s[k:e])
			if err != nil {
				return "", fmt.Errorf("asm template %s: %w", s[k:e], err)
			}
			b.WriteString(lit)
			k = e - 1
		default:
			return "", fmt.Errorf("asm template is not a string literal: %q", s)
		}
	}
	return b.String(), nil
}

// ptxRule maps PTX (whitespace collapsed) to runtime calls; $N is operand
// N of the statement (outputs first, then inputs), parenthesised.
type ptxRule struct {
	re   *regexp.Regexp
	emit func(m []string) string
}

func order(sem string) string {
	switch sem {
	case "acquire":
		return "__ATOMIC_ACQUIRE"
	case "release":
		return "__ATOMIC_RELEASE"
	case "acq_rel":
		return "__ATOMIC_ACQ_REL"
	case "sc":
		return "__ATOMIC_SEQ_CST"
	}
	return "__ATOMIC_RELAXED"
}

// The qualifiers that change nothing the emulation can observe (scope:
// every emulated thread is in one coherent system; cache hints).
const hints = `(?:\.(?:L1::no_allocate|L2::\d+B|L1::evict_\w+|L2::evict_\w+|cg|ca|cs|nc|lu))*`

var ptxRules = []ptxRule{
	{regexp.MustCompile(`^mov\.u64 %0, %%globaltimer;$`), func([]string) string { return "$0 = emu_globaltimer();" }},
	{regexp.MustCompile(`^ld\.(acquire|relaxed)\.(?:gpu|sys|cta)\.global` + hints + `\.([ub])(32|64) %0, \[%1\];$`),
		func(m []string) string { return fmt.Sprintf("$0 = emu_ld_u%s($1, %s);", m[3], order(m[1])) }},
	{regexp.MustCompile(`^st\.(release|relaxed)\.(?:gpu|sys|cta)\.global` + hints + `\.[ub](32|64) \[%0\], %1;$`),
		func(m []string) string { return fmt.Sprintf("emu_st_u%s($0, $1, %s);", m[2], order(m[1])) }},
	{regexp.MustCompile(`^fence\.(acq_rel|sc)\.(?:gpu|sys|cta);$`),
		func(m []string) string { return fmt.Sprintf("emu_fence(%s);", order(m[1])) }},
	{regexp.MustCompile(`^(?:red|atom)\.(relaxed|release|acquire|acq_rel)\.(?:gpu|sys|cta)\.global\.add\.u(32|64) \[%0\], %1;$`),
		func(m []string) string { return fmt.Sprintf("emu_atom_add_u%s($0, $1, %s);", m[2], order(m[1])) }},
	{regexp.MustCompile(`^atom\.(relaxed|release|acquire|acq_rel)\.(?:gpu|sys|cta)\.global\.add\.u(32|64) %0, \[%1\], (\d+);$`),
		func(m []string) string {
			return fmt.Sprintf("$0 = emu_atom_add_u%s($1, %s, %s);", m[2], m[3], order(m[1]))
		}},
	{regexp.MustCompile(`^atom\.(relaxed|release|acquire|acq_rel)\.(?:gpu|sys|cta)\.global\.add\.u(32|64) %0, \[%1\], %2;$`),
		func(m []string) string { return fmt.Sprintf("$0 = emu_atom_add_u%s($1, $2, %s);", m[2], order(m[1])) }},
	// Weak vector and scalar data accesses.
	{regexp.MustCompile(`^ld\.global` + hints + `\.v4\.[ub]32 \{%0, %1, %2, %3\}, \[%4\];$`),
		func([]string) string {
			return `uint32_t emu_w[4]; emu_ld_words($4, emu_w, 4, "ld.v4"); $0 = emu_w[0]; $1 = emu_w[1]; $2 = emu_w[2]; $3 = emu_w[3];`
		}},
	{regexp.MustCompile(`^st\.global` + hints + `\.v4\.[ub]32 \[%0\], \{%1, %2, %3, %4\};$`),
		func([]string) string {
			return `const uint32_t emu_w[4] = {(uint32_t)$1, (uint32_t)$2, (uint32_t)$3, (uint32_t)$4}; emu_st_words($0, emu_w, 4, "st.v4");`
		}},
	{regexp.MustCompile(`^ld\.global` + hints + `\.f32 %0, \[%1\];$`),
		func([]string) string { return "$0 = emu_ld_f32($1);" }},
	// Volatile and relaxed multi-word accesses (LL packets, FIFO triggers):
	// 8-byte halves, each single-copy atomic.
	{regexp.MustCompile(`^ld\.volatile\.global\.v4\.[ub]32 \{%0, %1, %2, %3\}, \[%4\];$`),
		func([]string) string {
			return `uint64_t emu_h[2]; emu_ld_halves($4, emu_h, 2, "ld.volatile.v4"); $0 = (uint32_t)emu_h[0]; $1 = (uint32_t)(emu_h[0] >> 32); $2 = (uint32_t)emu_h[1]; $3 = (uint32_t)(emu_h[1] >> 32);`
		}},
	{regexp.MustCompile(`^ld\.volatile\.global\.v2\.[ub]32 \{%0, %1\}, \[%2\];$`),
		func([]string) string {
			return `uint64_t emu_h[1]; emu_ld_halves($2, emu_h, 1, "ld.volatile.v2"); $0 = (uint32_t)emu_h[0]; $1 = (uint32_t)(emu_h[0] >> 32);`
		}},
	{regexp.MustCompile(`^st\.volatile\.global\.v4\.[ub]32 \[%0\], \{%1, %2, %3, %4\};$`),
		func([]string) string {
			return `const uint64_t emu_h[2] = {emu_pack2($1, $2), emu_pack2($3, $4)}; emu_st_halves($0, emu_h, 2, "st.volatile.v4");`
		}},
	{regexp.MustCompile(`^st\.volatile\.global\.v2\.[ub]32 \[%0\], \{%1, %2\};$`),
		func([]string) string {
			return `const uint64_t emu_h[1] = {emu_pack2($1, $2)}; emu_st_halves($0, emu_h, 1, "st.volatile.v2");`
		}},
	{regexp.MustCompile(`^st\.(relaxed|volatile)\.(?:sys\.|gpu\.)?global\.v2\.[ub]64 \[%0\], \{%1, %2\};$`),
		func([]string) string {
			return `const uint64_t emu_h[2] = {(uint64_t)$1, (uint64_t)$2}; emu_st_halves($0, emu_h, 2, "st.v2.u64");`
		}},
	// Half-precision conversions (plan_exec.cu).
	{regexp.MustCompile(`^\{ \.reg \.b16 (\w+); mov\.b16 (\w+), %1; cvt\.f32\.f16 %0, (\w+); \}$`),
		func([]string) string { return "$0 = emu_f16_to_f32($1);" }},
	{regexp.MustCompile(`^\{ \.reg \.b16 (\w+); cvt\.rn\.f16\.f32 (\w+), %1; mov\.b16 %0, (\w+); \}$`),
		func([]string) string { return "$0 = emu_f32_to_f16($1);" }},
}
