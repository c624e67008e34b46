// Package workers is the fleet as the gateway sees it: the registry of vLLM servers from
// config, health probing with ejection and readmission, metrics scraping, per-worker in-flight
// counts and one pooled HTTP client per worker.
package workers
