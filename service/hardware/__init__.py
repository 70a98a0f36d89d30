"""Hardware models (memory hierarchy, compute peaks), built-in profiles and the analytical cost model."""
