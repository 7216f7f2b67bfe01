"""The pure engine: device comparison, fit, scoring and layout. No I/O."""
