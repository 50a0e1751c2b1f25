package api

import (
	"fmt"
	"strconv"
	"strings"
)

// Milli is a non-negative decimal with three places, stored as thousandths:
// overcommit multipliers and CPU amounts in cores. Integers keep the FSM
// exact and deterministic; JSON shows it as a plain number (2.5).
type Milli int64

// ParseMilli reads "2", "2.5" or "0.125". More than three decimal places,
// signs, exponents and empty strings are refused: the product documents
// multipliers as "decimals with at most three decimal places".
func ParseMilli(s string) (Milli, error) {
	if s == "" {
		return 0, fmt.Errorf("empty number")
	}
	whole, frac, hasDot := strings.Cut(s, ".")
	if whole == "" || (hasDot && frac == "") {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	if len(frac) > 3 {
		return 0, fmt.Errorf("%q has more than three decimal places", s)
	}
	for _, part := range []string{whole, frac} {
		for _, r := range part {
			if r < '0' || r > '9' {
				return 0, fmt.Errorf("%q is not a decimal number", s)
			}
		}
	}
	if len(whole) > 12 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	w, _ := strconv.ParseInt(whole, 10, 64)
	f := int64(0)
	if frac != "" {
		f, _ = strconv.ParseInt((frac + "00")[:3], 10, 64)
	}
	return Milli(w*1000 + f), nil
}

// String prints the shortest exact decimal: 2500 → "2.5", 3000 → "3".
func (m Milli) String() string {
	neg := ""
	if m < 0 {
		neg, m = "-", -m
	}
	s := fmt.Sprintf("%s%d.%03d", neg, m/1000, m%1000)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}

func (m Milli) MarshalJSON() ([]byte, error) { return []byte(m.String()), nil }

func (m *Milli) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	neg := strings.HasPrefix(s, "-")
	v, err := ParseMilli(strings.TrimPrefix(s, "-"))
	if err != nil {
		return err
	}
	if neg {
		v = -v
	}
	*m = v
	return nil
}

// Scale returns n × m, rounded down: schedulable = reported × multiplier.
func (m Milli) Scale(n uint64) uint64 {
	if m <= 0 {
		return 0
	}
	hi := n / 1000
	lo := n % 1000
	return hi*uint64(m) + lo*uint64(m)/1000
}
