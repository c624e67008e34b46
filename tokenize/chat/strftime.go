package chat

import (
	"fmt"
	"strings"
	"time"
)

// strftime formats t like Python's datetime.strftime (C locale) for the directives chat
// templates use; the clock is naive local time, so %Z and %z are empty as in Python.
func strftime(t time.Time, format string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' || i+1 >= len(format) {
			b.WriteByte(c)
			continue
		}
		i++
		noPad := false
		if format[i] == '-' && i+1 < len(format) { // glibc extension: %-d, %-m, ...
			noPad = true
			i++
		}
		num := func(v, width int) {
			if noPad {
				fmt.Fprintf(&b, "%d", v)
			} else {
				fmt.Fprintf(&b, "%0*d", width, v)
			}
		}
		switch format[i] {
		case 'Y':
			fmt.Fprintf(&b, "%d", t.Year())
		case 'y':
			num(t.Year()%100, 2)
		case 'm':
			num(int(t.Month()), 2)
		case 'd':
			num(t.Day(), 2)
		case 'e':
			fmt.Fprintf(&b, "%2d", t.Day())
		case 'H':
			num(t.Hour(), 2)
		case 'I':
			h := t.Hour() % 12
			if h == 0 {
				h = 12
			}
			num(h, 2)
		case 'M':
			num(t.Minute(), 2)
		case 'S':
			num(t.Second(), 2)
		case 'f':
			fmt.Fprintf(&b, "%06d", t.Nanosecond()/1000)
		case 'j':
			num(t.YearDay(), 3)
		case 'p':
			if t.Hour() < 12 {
				b.WriteString("AM")
			} else {
				b.WriteString("PM")
			}
		case 'b', 'h':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'w':
			fmt.Fprintf(&b, "%d", int(t.Weekday()))
		case 'u':
			wd := int(t.Weekday())
			if wd == 0 {
				wd = 7
			}
			fmt.Fprintf(&b, "%d", wd)
		case 'D':
			b.WriteString(strftime(t, "%m/%d/%y"))
		case 'F':
			b.WriteString(strftime(t, "%Y-%m-%d"))
		case 'T':
			b.WriteString(strftime(t, "%H:%M:%S"))
		case 'R':
			b.WriteString(strftime(t, "%H:%M"))
		case 'c':
			b.WriteString(strftime(t, "%a %b %e %H:%M:%S %Y"))
		case 'x':
			b.WriteString(strftime(t, "%m/%d/%y"))
		case 'X':
			b.WriteString(strftime(t, "%H:%M:%S"))
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'Z', 'z':
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(format[i])
		}
	}
	return b.String()
}
