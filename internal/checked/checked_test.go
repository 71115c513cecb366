package checked

import (
	"math"
	"testing"
)

func TestMul(t *testing.T) {
	for _, c := range []struct {
		a, b, want int
		ok         bool
	}{
		{0, 0, 0, true}, {3, 7, 21, true}, {math.MaxInt, 1, math.MaxInt, true}, {1 << 31, 1 << 31, 1 << 62, true},
		{math.MaxInt, 2, 0, false}, {1 << 32, 1 << 32, 0, false}, {-1, 5, 0, false}, {5, -1, 0, false},
		{math.MaxInt/3 + 1, 3, 0, false},
	} {
		got, ok := Mul(c.a, c.b)
		if got != c.want || ok != c.ok {
			t.Errorf("Mul(%d, %d) = %d, %v; want %d, %v", c.a, c.b, got, ok, c.want, c.ok)
		}
	}
}
