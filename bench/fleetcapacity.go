package bench

import (
	"fmt"
	"math"
	"slices"
)

// CapacityPoint is one baseline run (round robin in issue 33) at one offered request rate.
type CapacityPoint struct {
	Label string
	// Rate is the offered request rate (Summary.InputConfig.OfferedRequestRate).
	Rate float64
	// TimeScale is the run's kvbench --time-scale.
	TimeScale float64
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
	// rateTimesScale is Rate × time scale for these runs (constant for one trace and --repeat):
	// TimeScaleFor turns a rate back into a time scale with it.
	rateTimesScale float64
}

// TimeScaleFor is the kvbench --time-scale that offers multiple × Rate with the same trace and
// --repeat as the runs the capacity was found from.
func (c FleetCapacity) TimeScaleFor(multiple float64) float64 {
	return c.rateTimesScale / (multiple * c.Rate)
}

// FindCapacity finds the offered rate at which the runs' TTFT p90 first passes limitMS, in
// order of rate. The runs must be of one trace and --repeat (their rate × time scale agrees
// within 1%), so that a rate maps to a time scale. It fails when the p90 is over the limit at
// the lowest rate (capacity lies below the runs) or never passes it (above them).
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
	k := ps[0].Rate * ps[0].TimeScale
	for _, p := range ps {
		if !(p.Rate > 0) || !(p.TimeScale > 0) {
			return FleetCapacity{}, fmt.Errorf("capacity: run %s has no offered rate (a fixed-schedule kvbench run writes one)", p.Label)
		}
		if r := p.Rate * p.TimeScale; math.Abs(r-k) > 0.01*k {
			return FleetCapacity{}, fmt.Errorf("capacity: run %s offers %.4g req/s at time scale %g, run %s %.4g at %g: not one trace and --repeat",
				p.Label, p.Rate, p.TimeScale, ps[0].Label, ps[0].Rate, ps[0].TimeScale)
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
		return FleetCapacity{Rate: rate, Below: lo, Above: hi, rateTimesScale: k}, nil
	}
	last := ps[len(ps)-1]
	return FleetCapacity{}, fmt.Errorf("capacity: TTFT p90 stays under %.0f ms up to the highest rate (%s, %.4g req/s, p90 %.0f ms): capacity is above the runs",
		limitMS, last.Label, last.Rate, last.P90MS)
}

// CapacityPointOf is the run's capacity point.
func CapacityPointOf(r *Run) CapacityPoint {
	s := r.Summary
	return CapacityPoint{Label: r.Path, Rate: s.InputConfig.OfferedRequestRate, TimeScale: s.InputConfig.TimeScale,
		P90MS: s.TimeToFirstToken.P90, Throughput: s.RequestThroughput.Avg}
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
