"""``perfscope whatif``: a measured run projected onto another GPU, batch, prompt, context, dtype or
draft length (docs/whatif.md). A room of its own in the pipeline: it reads a finished Report and the
cost model, and builds a new Report."""
