"""Dataset readers: SICK/STS (MaLSTM, demo text) and retrieval datasets (BEIR dirs, MIRACL,
WebFAQ)."""
