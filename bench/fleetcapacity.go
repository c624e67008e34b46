package bench

import (
	"fmt"
	"slices"
)

// CapacityPoint is one baseline run (round robin in issue 33) at one offered request rate.
type CapacityPoint struct {
	Label string
	// Rate is the offered request rate (Summary.InputConfig.OfferedRequestRate).
	Rate float64
	// TimeScale is the run's kvbench --time-scale and Users its --repeat.
	TimeScale float64
	Users     int
	// P90MS is the run's TTFT p90.
	P90MS float64
	// Throughput is the run's achieved request throughput (req/s).
	Throughput float64
}

// FleetCapacity is the request rate at which the baseline's TTFT p90 passes a limit: the
// fleet's capacity in issue 33's sense ("the rate where round robin's p90 TTFT passes 2 s").
type FleetCapacity struct {
	// Rate is the offered request rate where the p90 crosses the limit, linear between Below
	// and Above.
	Rate float64
	// Below is the fastest run under the limit before the first crossing, Above the run after it.
	Below, Above CapacityPoint
	// perUser is the offered rate of one user at time scale 1 (rate × time scale ÷ users, one
	// value for one trace; users started --repeat-stagger apart make it vary with their number,
	// so it is the mean of Below's and Above's): UsersFor and TimeScaleFor turn a rate back into
	// a load with it.
	perUser float64
}

// TimeScaleFor is the kvbench --time-scale at which users users of the runs' trace offer
// multiple × Rate.
func (c FleetCapacity) TimeScaleFor(multiple float64, users int) float64 {
	return c.perUser * float64(users) / (multiple * c.Rate)
}

// UsersFor is the number of users (kvbench --repeat, fractional: round it) of the runs' trace
// that offer multiple × Rate at the time scale.
func (c FleetCapacity) UsersFor(multiple, timeScale float64) float64 {
	return multiple * c.Rate * timeScale / c.perUser
}

// FindCapacity finds the offered rate at which the runs' TTFT p90 first passes limitMS, in
// order of rate. The runs must be of one trace, so that a rate maps back to users and a time
// scale. It fails when the p90 is over the limit at the lowest rate (capacity lies below the
// runs) or never passes it (above them).
func FindCapacity(points []CapacityPoint, limitMS float64) (FleetCapacity, error) {
	if len(points) < 2 {
		return FleetCapacity{}, fmt.Errorf("capacity: need runs at two rates at least, have %d", len(points))
	}
	ps := slices.Clone(points)
	slices.SortStableFunc(ps, func(a, b CapacityPoint) int {
		switch {
		case a.Rate < b.Rate:
			return -1
		case a.Rate > b.Rate:
			return 1
		}
		return 0
	})
	for _, p := range ps {
		if !(p.Rate > 0) || !(p.TimeScale > 0) {
			return FleetCapacity{}, fmt.Errorf("capacity: run %s has no offered rate (a fixed-schedule kvbench run writes one)", p.Label)
		}
	}
	if ps[0].P90MS > limitMS {
		return FleetCapacity{}, fmt.Errorf("capacity: TTFT p90 %.0f ms is over %.0f ms already at the lowest rate (%s, %.4g req/s): capacity is below the runs",
			ps[0].P90MS, limitMS, ps[0].Label, ps[0].Rate)
	}
	for i := 1; i < len(ps); i++ {
		lo, hi := ps[i-1], ps[i]
		if hi.P90MS <= limitMS {
			continue
		}
		rate := lo.Rate
		if hi.P90MS > lo.P90MS {
			rate += (limitMS - lo.P90MS) / (hi.P90MS - lo.P90MS) * (hi.Rate - lo.Rate)
		}
		return FleetCapacity{Rate: rate, Below: lo, Above: hi, perUser: (lo.perUser() + hi.perUser()) / 2}, nil
	}
	last := ps[len(ps)-1]
	return FleetCapacity{}, fmt.Errorf("capacity: TTFT p90 stays under %.0f ms up to the highest rate (%s, %.4g req/s, p90 %.0f ms): capacity is above the runs",
		limitMS, last.Label, last.Rate, last.P90MS)
}

// users is the point's users, 1 when unrecorded.
func (p CapacityPoint) users() int { return max(p.Users, 1) }

// perUser is one user's offered rate at time scale 1.
func (p CapacityPoint) perUser() float64 { return p.Rate * p.TimeScale / float64(p.users()) }

// CapacityPointOf is the run's capacity point.
func CapacityPointOf(r *Run) CapacityPoint {
	s := r.Summary
	return CapacityPoint{Label: r.Path, Rate: s.InputConfig.OfferedRequestRate, TimeScale: s.InputConfig.TimeScale,
		Users: s.InputConfig.Repeat, P90MS: s.TimeToFirstToken.P90, Throughput: s.RequestThroughput.Avg}
}

// Saturation is where the baseline's achieved request throughput stops following the offered
// rate: Max is the run with the highest throughput, Knee the lowest-rate run within frac of it
// (0.1: within 10%). It is the capacity to use where FindCapacity has none: on long-context
// agentic traces round robin's TTFT p90 passes 2 s at any load, as the prefills of the
// contexts it moves between workers alone take longer.
type Saturation struct {
	Max, Knee CapacityPoint
}

// FindSaturation returns the runs' Saturation; it fails without runs.
func FindSaturation(points []CapacityPoint, frac float64) (Saturation, error) {
	if len(points) == 0 {
		return Saturation{}, fmt.Errorf("saturation: no runs")
	}
	var s Saturation
	for i, p := range points {
		if i == 0 || p.Throughput > s.Max.Throughput {
			s.Max = p
		}
	}
	first := true
	for _, p := range points {
		if p.Throughput >= (1-frac)*s.Max.Throughput && (first || p.Rate < s.Knee.Rate) {
			s.Knee, first = p, false
		}
	}
	return s, nil
}
