# kvgate — build, test, demo, lint, bench. Binaries go to bin/.
# `make test` prepares a fresh machine itself (scripts/setup.sh): libzmq3-dev, staticcheck,
# the openai npm client for the end-to-end script.

GO          ?= go
STATICCHECK ?= $(shell go env GOPATH)/bin/staticcheck
BENCHTIME   ?= 2s

.PHONY: all build test setup fmt-check vet staticcheck lint gotest gotest-deploy e2e-node demo demo-basic bench bench-router \
	bench-index bench-tokenize bench-tokenize-hf bench-sim compare sweep replicas docs clean \
	release-check image

all: build

build:
	@mkdir -p bin
	$(GO) build -o bin/ ./cmd/...

setup:
	@scripts/setup.sh

fmt-check:
	@out="$$(gofmt -l $$(git ls-files -co --exclude-standard '*.go' 2>/dev/null || find . -name '*.go' -not -path './scripts/*/node_modules/*'))"; \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

# The hftokenizers backend cannot link here (no libtokenizers.a) but must still type-check.
# deploy/ is a Go module of its own (the Helm library stays out of the product's go.mod): ./...
# at the root does not reach it, so vet, staticcheck and the tests also run there.
vet:
	$(GO) vet ./...
	$(GO) vet -tags hftokenizers ./tokenize/...
	cd deploy && $(GO) vet ./...

staticcheck:
	$(STATICCHECK) ./...
	cd deploy && $(STATICCHECK) ./...

lint: setup fmt-check vet staticcheck

# cmd/kvgate's end-to-end tests are the longest package under -race on two cores (minutes, more
# while other packages share the cores): past go test's default 10-minute timeout per package.
# -vet=off: `make vet` has vetted every package with its tests already (go vet runs a superset
# of go test's vet checks).
# The tokenizer packages (tokenize/, tokenize/engine/) run their tests without -race, except the
# tests that share one tokenizer between goroutines (Concurrent*), which run with it: their code
# starts no goroutine, so the race detector finds nothing in their sequential tests, and there it
# costs ~6x (each real tokenizer.json load and format variant ~8 CPU-s, the golden corpora): all
# their tests under -race took 295 CPU-s, this way 60 (docs/development.md). The gateway's -race
# tests (server/, cmd/kvgate/) still tokenize concurrently through them.
TOKENIZE_PKGS := ./tokenize/ ./tokenize/engine/
gotest: gotest-deploy
	$(GO) test -race -vet=off -count=1 -timeout 30m $$($(GO) list ./... | grep -v -e '/tokenize$$' -e '/tokenize/engine$$')
	$(GO) test -vet=off -count=1 -timeout 15m $(TOKENIZE_PKGS)
	$(GO) test -race -vet=off -count=1 -timeout 15m -run 'Concurrent' $(TOKENIZE_PKGS)

# The deploy module's offline tests (the Helm chart rendered for every example and checked,
# the dashboard). Without -race: they are sequential render-and-decode checks with no goroutine
# of ours, and a race build of Helm and the Kubernetes modules would cost CI minutes for nothing.
# They run bin/kvgate serve --check-config on every rendered config. -vet=off: `make vet` vets
# the module already (go test's own vet pass would analyse every Kubernetes package again).
gotest-deploy: build
	cd deploy && KVGATE_BIN=../bin/kvgate VLLM_SIM_BIN=../bin/vllm-sim $(GO) test -vet=off -count=1 -timeout 15m ./...

# The official openai and @anthropic-ai/sdk npm clients against kvgate + two simulated workers
# (built binaries).
e2e-node: build
	node scripts/e2e-openai.mjs
	node scripts/e2e-anthropic.mjs
	node scripts/e2e-agents.mjs

# The image's build step without a container runtime: scripts/build-release.sh (stripped,
# -trimpath, cgo, version stamped) and its ldd check (nothing beyond libzmq's dependencies and
# libc).
release-check:
	scripts/build-release.sh bin/release/kvgate

# The container image (Dockerfile) with docker or podman: IMAGE=kvgate:TAG make image.
image:
	scripts/image.sh

test: setup fmt-check vet staticcheck release-check gotest e2e-node

# Two simulated workers, kvgate in front, a few chat requests with go-openai; all stopped after.
demo-basic: build
	scripts/demo-basic.sh

# The showcase: a 4-worker simulated fleet, kvgate in front, an agentic trace replayed through
# each policy, the comparison table against round robin and the HTML report path printed.
demo: setup build
	BIN=bin SKIP_BUILD=1 scripts/demo.sh

# Proxy overhead and relayed SSE events/s (gateway vs worker direct, same run).
bench:
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) ./server/

# Routing decision cost for a 32k-token prompt over 64 targets (p50/p99 reported), and the
# cluster's overhead on it (cluster off vs on, alternating in one loop: off-/on-p99-ns).
bench-router:
	$(GO) test -run '^$$' -bench KVDecision -benchtime 5000x ./router/
	$(GO) test -run '^$$' -bench KVDecisionCluster -benchtime 10000x ./cluster/

# Event application and Match latency of the tiered index (alone and under the other's load).
bench-index:
	$(GO) test -run '^$$' -bench 'Apply|Match' -benchtime 2000x ./indexers/

# Tokenizer throughput (Go engine) and the full request path of a 32k-token agentic chat.
bench-tokenize: setup
	$(GO) test -run '^$$' -bench 'HistoryTurn|EncodeShort' -benchtime 3x ./tokenize/engine/
	$(GO) test -run '^$$' -bench Agentic32k -benchtime 100x ./tokenize/

# Go engine vs HF tokenizers (npm binding of the Rust crate) on one core, side by side.
bench-tokenize-hf: setup
	scripts/goldens/compare-throughput.sh 1 3

# One simulated worker's sustained requests/s and events/s.
bench-sim: setup
	$(GO) test -run '^$$' -bench Worker -benchtime 3000x -cpu 1 ./sim/

# The demo's policy comparison on any trace: scripts/compare-policies.sh TRACE.
compare: setup build
	BIN=bin SKIP_BUILD=1 scripts/compare-policies.sh $(TRACE)

# Every policy at several load levels, as curves against load: scripts/load-sweep.sh TRACE
# (SMOKE=1 for a one-minute check).
sweep: setup build
	BIN=bin SKIP_BUILD=1 scripts/load-sweep.sh $(TRACE)

# Three kvgate replicas sharing NATS behind HAProxy (round robin), an agentic trace replayed
# through them: scripts/replicas.sh (REPLICAS, NATS, STOP_NATS_AT, COLD_REPLICA, COMPARE; see
# docs/replicas.md).
replicas: setup build
	BIN=bin SKIP_BUILD=1 scripts/replicas.sh $(TRACE)

# The generated documentation, after any config change (a field, its doc comment, a default):
# the table of config field doc comments compiled into kvgate (configs/configref), then
# docs/configuration.md from `kvgate config reference`. configs/configref's tests fail until
# both match the code; configs/kvgate.yaml is checked by them too but written by hand.
docs:
	$(GO) generate ./configs/configref
	$(GO) run ./cmd/kvgate config reference --out docs/configuration.md

clean:
	rm -rf bin out
