//! `gpurent admin backup` and `admin restore`: an online copy restored to books that balance.
