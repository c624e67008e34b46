package router

import (
	"github.com/kvgate/kvgate/kvkey"
	"github.com/kvgate/kvgate/router/latency"
)

// LatencyView is a target's TTFT model in GET /debug/workers (kv policy).
type LatencyView struct {
	// Theta is the coefficients scoring uses now (the fit once ready, else the prior); Fitted
	// is the fit's current estimate either way.
	Theta  map[string]float64 `json:"theta"`
	Fitted map[string]float64 `json:"fitted"`
	Prior  map[string]float64 `json:"prior"`
	// Samples is how many samples the fit took since its last reset; Ready whether it
	// replaced the prior.
	Samples int  `json:"samples"`
	Ready   bool `json:"ready"`
	// Sources are the samples by source since the last reset (gateway_ttft, worker_prefill,
	// worker_step, gateway_itl), each with the smoothed absolute relative error of its
	// predictions before the fit took them.
	Sources map[string]SourceView `json:"sources"`
	// ResidualMAD is the median absolute relative prediction error of the recent samples;
	// MeanBias their mean relative error (positive: predicted too long).
	ResidualMAD float64 `json:"residual_mad"`
	MeanBias    float64 `json:"mean_bias"`
	// PriorResidualMAD is the prior's median absolute relative error on the same samples: the
	// fit replaces the prior only while its ResidualMAD is at most this.
	PriorResidualMAD float64 `json:"prior_residual_mad"`
	// TTFTRatio is the 90th percentile of the recent ratios of measured to predicted TTFT
	// (streamed responses predicted at least 500 ms; 0 before 8): flow control's deadline
	// margin (Saturation.TTFTRatio).
	TTFTRatio float64 `json:"ttft_ratio"`
	// Drifts counts how often the fit saw the worker change speed and reopened its covariance.
	Drifts int `json:"drifts"`
	// WorkerTTFTMs, WorkerPrefillMs and WorkerTokensPerStep are the worker's own means over
	// recent scrape windows (vllm:time_to_first_token_seconds, vllm:request_prefill_time_seconds,
	// vllm:iteration_tokens_total), smoothed; absent until two readings differ.
	WorkerTTFTMs        *float64 `json:"worker_ttft_ms,omitempty"`
	WorkerPrefillMs     *float64 `json:"worker_prefill_ms,omitempty"`
	WorkerTokensPerStep *float64 `json:"worker_tokens_per_step,omitempty"`
	// WorkerITLMs is the worker's mean vllm:inter_token_latency_seconds over recent windows.
	WorkerITLMs *float64 `json:"worker_itl_ms,omitempty"`
	// The gateway's queue and decode accounting for the target.
	AheadTokens    float64 `json:"ahead_tokens"`
	DecodeRequests float64 `json:"decode_requests"`
	DecodeKVTokens float64 `json:"decode_kv_tokens"`
}

// SourceView is one source of a latency fit's samples (LatencyView.Sources).
type SourceView struct {
	Samples int     `json:"samples"`
	Error   float64 `json:"error"`
}

func thetaMap(th latency.Theta) map[string]float64 {
	names := latency.FeatureNames()
	out := make(map[string]float64, len(th))
	for i, v := range th {
		out[names[i]] = v
	}
	return out
}

// latencyView is t's model for the debug view (nil when the policy does not score by time).
func (p *KVPolicy) latencyView(t kvkey.Target) *LatencyView {
	if p.timed == nil {
		return nil
	}
	st, th := p.timed.state(t)
	v := &LatencyView{Theta: thetaMap(th), Fitted: thetaMap(p.timed.prior), Prior: thetaMap(p.timed.prior),
		AheadTokens: st.AheadTokens, DecodeRequests: st.DecodeRequests, DecodeKVTokens: st.DecodeKVTokens}
	if tt := p.timed.get(t); tt != nil {
		tt.mu.Lock()
		v.Fitted = thetaMap(tt.fitter.Fitted())
		v.Samples, v.Ready = tt.fitter.Samples(), tt.fitter.Ready()
		v.ResidualMAD, v.MeanBias, v.Drifts = tt.fitter.ResidualMAD(), tt.fitter.MeanBias(), tt.fitter.Drifts()
		v.PriorResidualMAD = tt.fitter.PriorResidualMAD()
		v.TTFTRatio = tt.ratios.quantile()
		v.Sources = make(map[string]SourceView, latency.NumSources)
		for i, n := range tt.fitter.SamplesBySource() {
			v.Sources[latency.Source(i).String()] = SourceView{Samples: n, Error: tt.srcErr[i]}
		}
		w := tt.worker
		tt.mu.Unlock()
		if w.hasTTFT {
			v.WorkerTTFTMs = &w.ttftMs
		}
		if w.hasPrefil {
			v.WorkerPrefillMs = &w.prefillMs
		}
		if w.hasSteps {
			v.WorkerTokensPerStep = &w.tokensPerStep
		}
		if w.hasITL {
			v.WorkerITLMs = &w.itlMs
		}
	}
	return v
}
