"""Token-cost estimation: text, images (header-only), audio, expected output; modality buckets."""
