// Package bench loads aiperf trace formats, synthesises prompts that reproduce their prefix
// sharing, replays them against an OpenAI endpoint and computes aiperf-style metrics and reports.
package bench
