"""From record tuples to files: the bounded buffer and the JSON-lines encoder (``encoding``), the
writer threads (``writer``) and the storage backends they append to (``storage``)."""
