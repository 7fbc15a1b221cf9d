# Thin wrapper: `make demo` and `make test` are the README's two commands.
PRESET ?= default
.PHONY: deps build demo test clean
deps:
	./scripts/install-deps.sh
build: deps
	cmake --preset $(PRESET)
	cmake --build --preset $(PRESET)
demo: build
	./build/$(PRESET)/apps/tdpipe sim scenarios/gpt3-175b-a100-8x8.yaml --engine analytic --schedule all
test: build
	ctest --preset $(PRESET)
clean:
	rm -rf build
