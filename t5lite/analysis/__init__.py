"""Looking inside models and embedding spaces: probes, attention analysis, contextual neighbours, alignment."""
