package etcdbackend

// TxnOps exports txnOps to the tests.
var TxnOps = txnOps
