"""SemBridge embedding initialisation: vocabulary partition, exact entmax weights, composition,
baselines."""
