"""The MaLSTM job: config (contract) and run (augment, pretrain on STS, train on SICK, calibrate)."""
