"""``saar bench``: what the processor costs on top of Envoy, measured on the machine at hand."""
