"""The log cleaner process: it compacts the partitions the timer process hands it (node.storage.cleaner)."""
