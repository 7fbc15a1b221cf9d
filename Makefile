# Thin wrapper over the README's two commands.
.PHONY: demo test clean
demo:
	./scripts/demo.sh
test:
	./scripts/test.sh
clean:
	rm -rf build
