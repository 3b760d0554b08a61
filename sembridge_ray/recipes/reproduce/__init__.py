"""The paper reproduction: a grid of (model, language, method, α) cells, each init -> per dataset
zero-shot eval -> fine-tune -> eval; results tables and plots. ``config`` is its contract, ``run`` its
run; the rest are the grid's cells, stages, plan, tables and plots."""
