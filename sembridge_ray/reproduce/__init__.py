"""The paper reproduction: a grid of (model, language, method, α) cells, each init -> per dataset
zero-shot eval -> fine-tune -> eval; results tables and plots."""
