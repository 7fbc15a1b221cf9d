#pragma once
typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclInProgress = 7 };
