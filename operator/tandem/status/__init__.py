"""Status derivation: the observed world -> conditions, pools and phase (pure)."""
