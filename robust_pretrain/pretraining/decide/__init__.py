"""Does worst-case or learned mixing beat a static mixture on your domains (``robust-pretrain-decide``):
:mod:`.recipe` (the command, its options, the cells in sequence), :mod:`.arms` (what each arm trains with),
:mod:`.cells` (the protocol, cells as jobs, locks and atomic records) and :mod:`.guards` (the regime checks: held-out
size, epochs drawn, readings over training)."""
