package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Progress is a live progress display for a replay: a redrawn bar on a terminal, a plain line
// every few seconds otherwise (logs, CI).
type Progress struct {
	w     io.Writer
	tty   bool
	label string
	total int
	start time.Time

	done, errs atomic.Int64
	stop       chan struct{}
	wg         sync.WaitGroup
	once       sync.Once
}

// NewProgress starts a display on w for total requests; call Stop when the run ends.
func NewProgress(w io.Writer, label string, total int) *Progress {
	p := &Progress{w: w, label: label, total: total, start: time.Now(), stop: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	every := 5 * time.Second
	if p.tty {
		every = 200 * time.Millisecond
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				p.draw(false)
			case <-p.stop:
				return
			}
		}
	}()
	return p
}

// Record counts one finished request (use as ReplayOptions.OnRecord).
func (p *Progress) Record(r *Record) {
	p.done.Add(1)
	if !r.OK() {
		p.errs.Add(1)
	}
}

// Stop ends the display and prints the final state.
func (p *Progress) Stop() {
	p.once.Do(func() {
		close(p.stop)
		p.wg.Wait()
		p.draw(true)
	})
}

func (p *Progress) draw(final bool) {
	done, errs := int(p.done.Load()), p.errs.Load()
	el := time.Since(p.start)
	rate := float64(done) / max(el.Seconds(), 1e-9)
	frac := 0.0
	if p.total > 0 {
		frac = min(float64(done)/float64(p.total), 1)
	}
	const width = 30
	fill := int(frac * width)
	bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
	if fill < width && fill > 0 {
		bar = bar[:fill-1] + ">" + bar[fill:]
	}
	line := fmt.Sprintf("%s [%s] %d/%d req %5.1f%%  %.1f req/s  errors %d  %s",
		p.label, bar, done, p.total, frac*100, rate, errs, el.Truncate(time.Second))
	switch {
	case p.tty && final:
		fmt.Fprintf(p.w, "\r\033[K%s\n", line)
	case p.tty:
		fmt.Fprintf(p.w, "\r\033[K%s", line)
	default:
		fmt.Fprintln(p.w, line)
	}
}
