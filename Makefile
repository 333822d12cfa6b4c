# Thin wrapper over Meson + Ninja. `make` builds into build/, `make test` runs the whole
# suite (tests/run), `make bench` the benchmarks, `make asan` the sanitizer build + suite.
BUILD ?= build
MESON_OPTS ?=

.PHONY: all test unit bench bench-density soak bench-store bench-s3 bench-tm bench-full bench-vm bench-cluster bench-ports bench-templates bench-code asan fuzz format lint clean
all: $(BUILD)/build.ninja
	ninja -C $(BUILD)

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_OPTS)

unit: all
	meson test -C $(BUILD) --suite unit --print-errorlogs

test: all
	BUILD=$(BUILD) tests/run

bench: bench-store
	BUILD=$(BUILD) bench/run

# density (bench/density.py): idle busybox sandboxes ramped up to 5,000 (stops at the first
# failed create, or when MemAvailable falls under 4 GiB), MemAvailable per sandbox, create→ready
# at 1k/2k/5k alive; BENCH_DENSITY_ARGS e.g. --target 2000 --snapshot-interval 0
bench-density: all
	/usr/bin/python3 bench/density.py --build $(BUILD) $(BENCH_DENSITY_ARGS)

# the soak (bench/soak.py): 200 sandboxes busy with file writes and exec loops for 10 minutes,
# coved's RSS and fds per minute, nothing left after; SOAK_ARGS e.g. --minutes 2 --sandboxes 50
soak: all
	/usr/bin/python3 bench/soak.py --build $(BUILD) $(SOAK_ARGS)

# time machine through the API (bench/timemachine.py): snapshot pause, pause/resume, fork of 10
bench-tm: all
	/usr/bin/python3 bench/timemachine.py --build $(BUILD) $(BENCH_TM_ARGS)

# exposed ports: preview URL vs straight to the sandbox's server (bench/ports_bench.py)
bench-ports: all
	BUILD=$(BUILD) /usr/bin/python3 bench/ports_bench.py $(BENCH_PORTS_ARGS)

# chunk store capture/restore/dedup figures (bench/chunkstore_bench.c); BENCH_STORE_ARGS e.g. --mb 256
bench-store: all
	$(BUILD)/bench/chunkstore_bench $(BENCH_STORE_ARGS)
	$(BUILD)/bench/keys_bench --kms tests/security/kms.sh

# the S3 chunk store (a throwaway radosgw) against the local one, same run
bench-s3: all
	BUILD=$(BUILD) bench/s3_bench.sh $(BENCH_S3_MB)

# full snapshots (CRIU) of a sandbox holding 100 MB in RAM; BENCH_FULL_ARGS e.g. --mb 200 --runs 5
bench-full: all
	BUILD=$(BUILD) python3 bench/full_snapshot_bench.py $(BENCH_FULL_ARGS)

# vm runtime through the API next to qemu-system-x86_64 alone (bench/vm_bench.py; root, QEMU
# and the guest kernel from scripts/install-deps); BENCH_VM_ARGS e.g. --n 20
bench-vm: all
	/usr/bin/python3 bench/vm_bench.py --build $(BUILD) $(BENCH_VM_ARGS)

# the cluster next to role all, same run (bench/cluster_bench.{py,c}): placement cycles/s on a
# throwaway PostgreSQL vs SQLite; with root, a whole cluster on this machine (tests/lib/cluster.py):
# create→ready, resume on another node, drain of 20, idle cost of a node; BENCH_CLUSTER_ARGS
# e.g. --parts placement,idle --idle-s 30
bench-cluster: all
	/usr/bin/python3 bench/cluster_bench.py --build $(BUILD) $(BENCH_CLUSTER_ARGS)
	$(BUILD)/bench/forward_bench
	/usr/bin/python3 bench/forward_bench.py --build $(BUILD)

# templates from images (bench/templates_bench.py; root, skopeo, umoci, docker-registry, a
# built base template in COVE_TEMPLATES_DIR): pull+unpack vs skopeo+umoci, rebuild, create,
# storage of shared layers
# the code interpreter: runCode('1+1') warm, vs the server from inside, vs exec; first cell
bench-code: all
	/usr/bin/python3 bench/code_bench.py --build $(BUILD)

bench-templates: all
	/usr/bin/python3 bench/templates_bench.py --build $(BUILD) $(BENCH_TEMPLATES_ARGS)

asan:
	$(MAKE) BUILD=build-asan MESON_OPTS="-Db_sanitize=address,undefined -Db_lundef=false" test

fuzz:
	tests/fuzz/run

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

lint:
	scripts/check-seams.sh
	clang-format --dry-run --Werror $$(git ls-files '*.c' '*.h')
	cppcheck --quiet --error-exitcode=1 --inline-suppr --enable=warning,portability \
	  --suppress=missingIncludeSystem --include=/usr/include/jansson.h -I src/lib $$(git ls-files 'src/*.c')

clean:
	rm -rf build build-asan build-fuzz
