"""The bundled pure-NumPy workloads: jobman experiments to run, test and copy.

Entry points (jobman targets, each ``fn(state, channel)``):

- ``jobman.models.mlp:train``     a multilayer perceptron classifier
- ``jobman.models.dbn:pretrain``  phase 0 of a DBN: greedy RBM pretraining (CD-k or PCD)
- ``jobman.models.dbn:finetune``  phase 1 of a DBN: fine-tuning of the parent's stack
- ``jobman.models.dbn:train``     both DBN phases in one job
- ``jobman.models.cv:retrain``    fan-in after cross-validation: retrain the best configuration

Every trainer reports ``train_error``, ``valid_error``, ``test_error`` (fractions),
``epochs`` and ``seconds``, logs its learning curves through ``channel.log``,
keeps its weights, optimizer slots and RNG in its workdir, and resumes from them
bit for bit when relaunched. The modules below them: ``layers``, ``optim``,
``rbm`` (the maths), ``datasets``, ``folds``, ``splits`` (the data), ``loop``,
``schedules``, ``plugins``, ``checkpoint`` (the training machinery), ``variables`` (weights with
their updater's slots, local or in the parameter server) and ``parallel`` (the MLP trained across the
ranks of a gang job, ``ps=1 --ranks N``).
"""
