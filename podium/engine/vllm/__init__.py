"""The vLLM engine: vLLM's ``AsyncLLM`` in this process (its engine core in a child process),
token ids in and out. Importing this package needs no vLLM; its modules import it when used."""
