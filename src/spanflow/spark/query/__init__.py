"""One sink's query around its run: supervision and status, the fence, start slots,
readers starting one at a time, progress figures and watermark beats."""
