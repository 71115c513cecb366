package plan

import (
	"strings"
	"testing"
)

// Errors speak of the file's JSON, never of Go types, and repeat at most a
// bounded part of a string read from the file.
func TestErrorMessagesNameJSONKindsAndBoundEchoes(t *testing.T) {
	good := spec{tbs: []string{tb(0, op("put", memory, src(loc("i", 0, 2)), dst(rem(peerO, 0, 2))), sync2[0], sync2[1])}}.json()
	huge := strings.Repeat("x", 100_000)
	cases := []struct {
		name, json, want string
	}{
		{"array at the top", `[1, 2]`, "the plan at line 1: JSON array where an object is expected"},
		{"gpus an object", strings.Replace(good, `"gpus":[`, `"gpus":{"a":[`, 1) + "}", `where an array is expected`},
		{"inplace a string", strings.Replace(good, `"inplace":false`, `"inplace":"no"`, 1), `field "inplace" at line 1: JSON string where true or false is expected`},
		{"index a string", strings.Replace(good, `"index":0`, `"index":"0"`, 1), `JSON string where a whole number is expected`},
		{"huge protocol", strings.Replace(good, `"protocol":"Simple"`, `"protocol":"`+huge+`"`, 1), "(100000 bytes in all)"},
		{"huge op name", strings.Replace(good, `"name":"put"`, `"name":"`+huge+`"`, 1), "(100000 bytes in all)"},
		{"huge plan name", strings.Replace(strings.Replace(good, `"name":"`, `"name":"`+huge, 1), `"protocol":"Simple"`, `"protocol":"LL128"`, 1), `field "protocol"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.json))
			if err == nil {
				t.Fatal("parsed")
			}
			msg := err.Error()
			if !strings.Contains(msg, c.want) {
				t.Fatalf("error %q does not contain %q", msg, c.want)
			}
			for _, goType := range []string{"map[", "json.RawMessage", "plan.", "[]", "int64", "bool"} {
				if strings.Contains(msg, goType) {
					t.Fatalf("error names a Go type (%s): %q", goType, msg)
				}
			}
			if len(msg) > 1000 {
				t.Fatalf("error is %d bytes long: the echo is not bounded", len(msg))
			}
		})
	}
}

func TestClip(t *testing.T) {
	if got := clip("short"); got != "short" {
		t.Fatalf("clip(short) = %q", got)
	}
	long := strings.Repeat("é", 300) // 600 bytes, two per rune
	got := clip(long)
	if !strings.HasSuffix(got, "... (600 bytes in all)") || len(got) > maxEcho+40 {
		t.Fatalf("clip = %q", got)
	}
	if !strings.HasPrefix(long, strings.TrimSuffix(got, "... (600 bytes in all)")) {
		t.Fatal("clip cut inside a rune or changed the text")
	}
}
