"""What kerastorch writes to disk and reads back: weights files (safetensors, or torch's plain
state dict), training-state files, both written atomically and read without running code
stored in them."""
