"""Renderers: turn a run (and its analysis) into something a person looks at, one format per module,
imported lazily by the commands that use them."""
