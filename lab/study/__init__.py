"""Engineers compared at equal compute: experiments of arms x seeds (`experiments`), run on this machine or on a
Slurm cluster (`slurm`), their statistics and report (`comparison`), the published numbers beside them
(`reference`), and the shipped example run and studies a new lab imports (`example`). Docs: docs/experiments.md,
docs/example.md."""
