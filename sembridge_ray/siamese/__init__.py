"""MaLSTM (Mueller & Thyagarajan, AAAI 2016): siamese LSTM relatedness on SICK, free of Ray."""
