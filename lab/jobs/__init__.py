"""The jobs the queue holds, run: the worker that claims them (`worker`), the process of its own a job that loads a
model runs in (`child`), and the zygote that forks those processes with the training stack already imported
(`zygote`). Docs: docs/worker.md."""
